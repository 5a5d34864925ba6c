"""Prompts handed to nodes, and the verified rollouts waiting to be trained on.

One structure serves both modes. The learner chooses every prompt and hands
it to one node at a time with a deadline; a prompt not answered by then goes
to the next node that asks. Verified groups wait in a FIFO replay buffer until
a training step takes them.

- sync (staleness 0): the pool is open only while the current version's
  prompts are being rolled out; a step takes exactly one batch made with the
  current version, then the pool stays shut until the next version is out.
- async (staleness S): the pool stays open; it hands out prompts while
  outstanding plus buffered groups are below ``capacity``, and a step takes
  the oldest groups made with a version no older than current - S.

A share of the prompts (``twin_share``) is handed twice, to two different
peers: each of the pair is a group of the same prompt, trained on like any
other, and their scores side by side tell a peer that picks its groups by
reward (``echo_learner.verify.selection``) far sooner than scores of different
prompts can. Which prompts are twins nobody is told.

Everything is bounded: ``capacity`` groups in flight or buffered (plus what
``newcomers`` hold), and at most ``memory`` assignments remembered
(older ones can only fail verification).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from echo_learner.swarm.changes import Changes
from echo_learner.swarm.live_prompts import LivePrompts
from echo_learner.tasks.base import TaskPrompt
from echo_learner.training.trainer import ScoredGroup


@dataclass
class Assignment:
    prompt_id: int
    prompt: TaskPrompt
    tokens: tuple[int, ...]
    version: int  # the learner's version when it was (last) handed out
    peer: str
    deadline: float  # trio clock
    handed_at: float  # trio clock
    holders: list[str] = field(default_factory=list)  # every peer it was ever given to
    given_back: list[str] = field(default_factory=list)  # peers that released it (their batch was refused)
    answered: bool = False
    lapse_charged: bool = False  # its expiry was counted against the holder
    twin: int | None = None  # pairs of one prompt handed to two peers share this: the first's prompt_id

    def live(self, now: float, min_version: int) -> bool:
        """Unanswered, unexpired at ``now`` and handed out for this round."""
        return not self.answered and self.deadline >= now and self.version >= min_version


@dataclass(frozen=True)
class Rollouts:
    """A verified, scored group in the replay buffer."""

    version: int  # the policy version that generated it
    peer: str
    group: ScoredGroup


PromptFactory = Callable[[], tuple[TaskPrompt, tuple[int, ...]]]


class Newcomers(Protocol):
    """The peers whose prompts are extra to the pool's capacity."""

    def __contains__(self, peer: object) -> bool: ...

    def hold(self, held: Counter[str]) -> int:
        """What they hold together, of ``held`` (prompts per peer)."""
        ...


class NoNewcomers:
    def __contains__(self, peer: object) -> bool:
        return False

    def hold(self, held: Counter[str]) -> int:
        return 0


class PromptPool:
    def __init__(
        self,
        new_prompt: PromptFactory,
        *,
        capacity: int,
        assignment_timeout_s: float,
        memory: int,
        twin_share: float = 0.0,
        rng: random.Random | None = None,
        on_lapsed: Callable[[str], None] | None = None,
        newcomers: Newcomers | None = None,
    ):
        """``on_lapsed`` is told of each peer whose prompt expired unanswered
        (the learner strikes it). ``newcomers`` are peers whose prompts do not
        count against capacity: untried ones, which may never answer (the
        learner bounds how many they hold, see echo_learner/swarm/fairness.py).
        They are handed prompts beyond capacity, so a step never waits on them
        and they are never crowded out."""
        self.new_prompt = new_prompt
        self.twin_share = twin_share
        self.rng = rng or random.Random()
        # Firsts of twin pairs whose second is still to be handed out.
        self._firsts: deque[Assignment] = deque(maxlen=capacity)
        self.capacity = capacity
        self.assignment_timeout_s = assignment_timeout_s
        self.memory = memory
        self.assignments: OrderedDict[int, Assignment] = OrderedDict()
        # The unanswered ones among them, in the same order: what every
        # question below looks at. Answered ones are most of ``assignments``
        # (it remembers ``memory``), and a learner serving many nodes asks
        # these questions on every work request.
        self.unanswered: OrderedDict[int, Assignment] = OrderedDict()
        # Prompts of this round (made for ``min_version`` or newer) ever
        # handed to each peer, kept as assignments change (``handed``).
        self._handed: Counter[str] = Counter()
        # Every change of an assignment bumps ``_edits``.
        self._edits = 0
        self._live_prompts = LivePrompts()
        # The earliest deadline of an unanswered prompt whose lapse is not
        # charged yet (or earlier): before it, ``_charge_lapses`` has nothing to do.
        self._next_lapse = math.inf
        self.buffer: deque[Rollouts] = deque()
        self.next_prompt_id = 0
        self.open = False  # the learner opens it once a version is out
        self.min_version = 0  # assignments made before this version are useless
        self._changed = trio.Event()
        self._room = trio.Event()
        self.expired = 0  # prompts that expired unanswered, ever
        self.on_lapsed = on_lapsed
        self.newcomers: Newcomers = newcomers or NoNewcomers()

    # --- handing out ---------------------------------------------------------

    @property
    def edits(self) -> int:
        """Changes so far to its assignments, buffer or round: what was
        derived from the pool holds while this stays the same (and until
        ``next_expiry``)."""
        return self._edits

    def outstanding(self) -> int:
        now = trio.current_time()
        return sum(a.live(now, self.min_version) for a in self.unanswered.values())

    def handed(self, peer: str) -> int:
        """Prompts of this round (made for ``min_version`` or newer) ever handed to ``peer``."""
        return self._handed[peer]

    def _count(self, a: Assignment, sign: int) -> None:
        """Add (1) or take away (-1) what ``a`` adds to ``_handed``."""
        if a.version >= self.min_version:
            for peer in set(a.holders):
                self._handed[peer] += sign
                if not self._handed[peer]:
                    del self._handed[peer]

    def _live_now(self) -> LivePrompts:
        self._live_prompts.expire(trio.current_time())
        return self._live_prompts

    def held_since(self) -> dict[str, float]:
        """When each peer was handed the oldest live prompt it holds (trio
        clock; it changes with the pool: read it, do not change it)."""
        return self._live_now().since

    def unassigned(self, held: Counter[str] | None = None) -> int:
        """Prompts the pool would still hand to peers that count against
        its capacity (sync: of this step; async: of what the buffer has room
        for). ``held``: ``held()``, if the caller has it at hand."""
        held = self.held() if held is None else held
        counted = self._live_prompts.total - self.newcomers.hold(held)
        return max(0, self.capacity - len(self.buffer) - counted)

    def next_expiry(self) -> float:
        """When the next live prompt expires (trio clock; ``inf``: none is live)."""
        return self._live_now().next_expiry()

    @property
    def changes(self) -> Changes:
        """The peers whose live prompts changed (``held``, ``held_since``)."""
        return self._live_prompts.changes

    def held(self) -> Counter[str]:
        """Live (unanswered, unexpired) prompts per peer (it changes with
        the pool: read it, do not change it)."""
        return self._live_now().held

    def take(self, peer: str, max_prompts: int, version: int) -> list[Assignment]:
        """Hand ``peer`` up to ``max_prompts`` prompts to roll out with ``version``.

        Peers that let a prompt expire unanswered are told to ``on_lapsed``
        (once per peer and call, each expired prompt counted once).
        """
        if not self.open:
            return []
        now = trio.current_time()
        self._charge_lapses(now)
        provisional = peer in self.newcomers
        if provisional:
            room = max_prompts  # extra to the pool; the caller bounds what such peers hold
        else:
            room = min(max_prompts, self.unassigned())
        taken: list[Assignment] = []
        # Expired, still useful prompts first: a slow node must not starve a
        # step. Never back to a peer that already let it lapse, nor to an
        # untried one (it may let it lapse again).
        for a in self._live_now().expired.values() if not provisional else ():
            if len(taken) >= room:
                break
            if peer not in a.holders:
                taken.append(a)

        while len(taken) < room:
            first = self._first_for(peer, version)
            if first is not None:
                taken.append(self._add(first.prompt, first.tokens, version, peer, now, twin=first.prompt_id))
                continue
            prompt, tokens = self.new_prompt()
            a = self._add(prompt, tokens, version, peer, now)
            if self.rng.random() < self.twin_share:
                a.twin = a.prompt_id
                self._firsts.append(a)
            taken.append(a)
        for a in taken:
            self._live_prompts.discard(a)
            self._count(a, -1)
            a.peer, a.version, a.handed_at, a.lapse_charged = peer, version, now, False
            a.deadline = now + self.assignment_timeout_s
            self._next_lapse = min(self._next_lapse, a.deadline)
            a.holders.append(peer)
            self._count(a, +1)
            if a.version >= self.min_version:
                self._live_prompts.add(a)
        self._forget(now)
        self._edits += 1
        return taken

    def _add(
        self, prompt: TaskPrompt, tokens: tuple[int, ...], version: int, peer: str, now: float, twin: int | None = None
    ) -> Assignment:
        a = Assignment(self.next_prompt_id, prompt, tokens, version, peer, 0.0, now, twin=twin)
        self.next_prompt_id += 1
        self.assignments[a.prompt_id] = self.unanswered[a.prompt_id] = a
        return a

    def _first_for(self, peer: str, version: int) -> Assignment | None:
        """A twin pair's first, made for ``version`` and never handed to
        ``peer``, whose second ``peer`` may take (it leaves the waiting line);
        None if there is none. Firsts of older versions are dropped: side by
        side, two groups say most when made with one policy."""
        while self._firsts and self._firsts[0].version < version:
            self._firsts.popleft()
        for first in self._firsts:
            if first.version == version and peer != first.peer and peer not in first.holders:
                self._firsts.remove(first)
                return first
        return None

    def _forget(self, now: float) -> None:
        """Keep at most ``memory`` assignments: answered and expired ones go
        first, oldest first. A live one forgotten could never lapse (a peer
        that never answers would never be struck) nor be verified."""
        excess = len(self.assignments) - self.memory
        if excess <= 0:
            return
        done = list(
            itertools.islice((pid for pid, a in self.assignments.items() if a.answered or a.deadline < now), excess)
        )
        for pid in done:
            self._count(a := self.assignments.pop(pid), -1)
            self.unanswered.pop(pid, None)
            self._live_prompts.discard(a)
        while len(self.assignments) > self.memory:  # all live: the bound still holds
            pid, a = self.assignments.popitem(last=False)
            self._count(a, -1)
            self.unanswered.pop(pid, None)
            self._live_prompts.discard(a)

    def _charge_lapses(self, now: float) -> None:
        if now <= self._next_lapse:
            return  # no deadline passed since the last look: nothing to scan (a take each work request)
        lapsed = set()
        self._next_lapse = math.inf
        for a in self.unanswered.values():
            if a.answered or a.lapse_charged:
                continue
            if a.deadline < now:
                a.lapse_charged = True
                self.expired += 1
                lapsed.add(a.peer)
            else:
                self._next_lapse = min(self._next_lapse, a.deadline)
        if self.on_lapsed is not None:
            for peer in lapsed:
                self.on_lapsed(peer)

    def release(self, peer: str, prompt_ids: list[int]) -> None:
        """``peer`` gives back the prompts it holds among ``prompt_ids``: none
        is counted as lapsed (it answered, if too late), and the live ones go
        to the next node that asks (not back to ``peer``)."""
        now = trio.current_time()
        for pid in prompt_ids:
            a = self.assignments.get(pid)
            if a is None or a.peer != peer or a.answered:
                continue
            if a.live(now, self.min_version):
                a.deadline = now - 1e-9
                a.given_back.append(peer)
                self._live_prompts.release(a)
            a.lapse_charged = True
        self._notify(room=True)

    def lookup(self, prompt_id: int) -> Assignment | None:
        return self.assignments.get(prompt_id)

    # --- filling and draining ------------------------------------------------

    def answer(self, assignment: Assignment, rollouts: Rollouts) -> None:
        assignment.answered = True
        self.unanswered.pop(assignment.prompt_id, None)
        self._live_prompts.discard(assignment)
        self.buffer.append(rollouts)
        self._notify()

    async def take_batch(self, size: int, min_version: int) -> list[Rollouts]:
        """Wait for ``size`` buffered groups made with ``min_version`` or newer
        (older ones are dropped) and take the oldest."""
        while True:
            fresh = deque(r for r in self.buffer if r.version >= min_version)
            if len(fresh) != len(self.buffer):
                self.buffer = fresh
                self._notify(room=True)  # dropped stale groups: room for more prompts
            if len(self.buffer) >= size:
                batch = [self.buffer.popleft() for _ in range(size)]
                self._notify(room=True)
                return batch
            await self._changed.wait()

    def set_open(self, open_: bool, min_version: int | None = None) -> None:
        self.open = open_
        if min_version is not None and min_version != self.min_version:
            self.min_version = min_version
            self._handed = Counter()
            for a in self.assignments.values():
                self._count(a, +1)
            self._live_prompts.rebuild(self.unanswered.values(), min_version, trio.current_time())
        self._notify(room=True)

    async def wait_changed(self, *, room: bool = False) -> None:
        """Until anything changes (an answer, a step, a release, a new
        round), or with ``room`` until the pool may hand out prompts it could
        not before: a step took groups from the buffer, a peer gave prompts
        back, or the round changed (or the next expiry, which nothing
        announces: the caller's timer). An answer makes no room: its prompt
        leaves the live ones for the buffer. When the pool is full, a crowd
        of waiting requests woken by every answer would each look again for
        nothing."""
        await (self._room if room else self._changed).wait()

    def _notify(self, *, room: bool = False) -> None:
        self._edits += 1
        self._changed.set()
        self._changed = trio.Event()
        if room:
            self._room.set()
            self._room = trio.Event()

    # --- checkpoints ---------------------------------------------------------

    def state(self) -> dict:
        """What a checkpoint keeps: the buffer and the prompt counter (plain types)."""
        return {
            "next_prompt_id": self.next_prompt_id,
            "buffer": [
                {
                    "version": r.version,
                    "peer": r.peer,
                    "prompt_tokens": list(r.group.prompt_tokens),
                    "completions": [list(c) for c in r.group.completions],
                    "behaviour_logprobs": [list(b) for b in r.group.behaviour_logprobs],
                    "rewards": list(r.group.rewards),
                }
                for r in self.buffer
            ],
        }

    def restore(self, state: dict, version_offset: int) -> None:
        """Reload a checkpoint's buffer; versions shift by ``version_offset``
        because a resumed learner numbers its versions after every one it ever
        published (nodes may hold those)."""
        self.next_prompt_id = state["next_prompt_id"]
        self.buffer = deque(
            Rollouts(
                version=b["version"] + version_offset,
                peer=b["peer"],
                group=ScoredGroup(
                    prompt_tokens=tuple(b["prompt_tokens"]),
                    completions=tuple(tuple(c) for c in b["completions"]),
                    behaviour_logprobs=tuple(tuple(x) for x in b["behaviour_logprobs"]),
                    rewards=tuple(b["rewards"]),
                ),
            )
            for b in state["buffer"]
        )
