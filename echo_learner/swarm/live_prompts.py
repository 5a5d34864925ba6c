"""The live prompts of a ``PromptPool``, kept as they change.

A prompt is live while it is unanswered, its deadline has not passed and it
was handed out for the round (its version at least the pool's
``min_version``). Every work request asks who holds how many live prompts,
since when, and when the next one expires; rescanning every unanswered
prompt for that cost the learner a pass over everything in flight per request
(docs/learner.md, "Many volunteers").

Every prompt gets the same time to answer, so deadlines come in the order
prompts are handed out: the live ones are kept in that order, expire from the
front, and each peer's oldest is the first of its own. Expired ones that may
be handed out again wait in ``expired``, oldest deadline first.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Protocol

from echo_learner.swarm.changes import Changes


class Assignment(Protocol):
    """What is read of a prompt handed out (``pool.Assignment``)."""

    prompt_id: int
    peer: str
    version: int
    handed_at: float
    deadline: float


class LivePrompts:
    def __init__(self) -> None:
        self.changes = Changes()  # peers whose live prompts changed
        self._clear()

    def _clear(self) -> None:
        self.held: Counter[str] = Counter()  # live prompts per peer
        self.total = 0  # all live prompts
        self.since: dict[str, float] = {}  # when each holder was handed its oldest live one
        self.expired: OrderedDict[int, Assignment] = OrderedDict()  # unanswered, of the round, past the deadline
        self._live: OrderedDict[int, Assignment] = OrderedDict()  # in deadline order
        self._by_peer: dict[str, OrderedDict[int, float]] = {}  # each holder's, in the order handed

    def add(self, a: Assignment) -> None:
        """``a`` was just handed out: live until its deadline, which no live one's is after."""
        self._live[a.prompt_id] = a
        self.changes.note(a.peer)
        self._by_peer.setdefault(a.peer, OrderedDict())[a.prompt_id] = a.handed_at
        self.held[a.peer] += 1
        self.total += 1
        self.since.setdefault(a.peer, a.handed_at)

    def discard(self, a: Assignment) -> None:
        """``a`` is neither live nor to be handed out again (answered, forgotten, taken)."""
        if self._live.pop(a.prompt_id, None) is not None:
            self._leave_holder(a)
        else:
            self.expired.pop(a.prompt_id, None)

    def release(self, a: Assignment) -> None:
        """``a``, live, was given back: the next node that asks may take it."""
        self.discard(a)
        self.expired[a.prompt_id] = a

    def expire(self, now: float) -> None:
        """Move every prompt whose deadline is before ``now`` out of the live ones."""
        while self._live:
            a = next(iter(self._live.values()))
            if a.deadline >= now:
                return
            del self._live[a.prompt_id]
            self._leave_holder(a)
            self.expired[a.prompt_id] = a

    def next_expiry(self) -> float:
        """The earliest deadline of a live prompt (``inf``: none is live)."""
        return next(iter(self._live.values())).deadline if self._live else math.inf

    def rebuild(self, unanswered: Iterable[Assignment], min_version: int, now: float) -> None:
        """Start again from every unanswered prompt (a new round's ``min_version``)."""
        self._clear()
        self.changes.everything()
        kept = [a for a in unanswered if a.version >= min_version]
        for a in sorted((a for a in kept if a.deadline >= now), key=lambda a: a.deadline):
            self.add(a)
        for a in sorted((a for a in kept if a.deadline < now), key=lambda a: a.deadline):
            self.expired[a.prompt_id] = a

    def _leave_holder(self, a: Assignment) -> None:
        self.changes.note(a.peer)
        self.total -= 1
        mine = self._by_peer[a.peer]
        del mine[a.prompt_id]
        if mine:
            self.held[a.peer] -= 1
            self.since[a.peer] = next(iter(mine.values()))
        else:
            del self._by_peer[a.peer], self.held[a.peer], self.since[a.peer]
