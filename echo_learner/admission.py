"""What every work request asks of the swarm, derived once per change.

Each work request asks the same questions: which peers asked for work
recently and which of them have had a batch accepted (``fairness``), how many
prompts the newcomers hold between them, how many prompts of the round are
still to be handed out, and when the round ends in the learner's model of it
(``sizing.round_end_s``). Answered afresh, each is a scan of the active
peers; and every change of the pool wakes up to ``--max-waiting-requests``
requests that all ask again. At 1,000 identities that was 187 ms of learner
CPU per accepted batch (docs/learner.md, "Many volunteers").

``Admission.view`` derives the answers in one pass and keeps them while
nothing they depend on has changed: the pool's assignments and buffer
(``PromptPool.edits``), the peer book (``PeerBook.revision``: a peer new,
forgotten, back after a quiet spell, or with a new verdict), and time only
where time changes them (the next prompt to expire, the next peer to fall
quiet, the last proven peer falling quiet). So the answers are exactly what
a full recomputation gives at the same moment (tests/learner/test_admission.py
checks every figure against one). The round's end depends on the moment as
well; ``RoundModel`` holds the round sorted so that it is answered for any
moment in O(log n).
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from dataclasses import dataclass

import trio

from echo_learner.peers import PeerBook
from echo_learner.pool import PromptPool


class RoundModel:
    """``sizing.round_end_s`` for any moment, from the workers' absolute
    finishing times: each measured worker works through what it holds until
    ``ends[i]`` (a time on one clock) at ``rates[i]`` prompts a second.

    ``round_end_s`` water-fills the unassigned prompts onto the workers in
    the order they fall free and stops at the first worker whose free time
    the fluid finish does not reach; with the workers sorted once, that
    worker is a binary search on prefix sums, and the two bounds it is
    compared with are prefix and suffix minima. Equal to ``round_end_s`` up
    to float rounding."""

    def __init__(self, ends: list[float], rates: list[float]):
        assert ends and len(ends) == len(rates) and all(r > 0 for r in rates)
        order = sorted(range(len(ends)), key=ends.__getitem__)
        # Anchored at the first end, so that sums of rate x time stay small.
        self.origin = ends[order[0]]
        self.ends = [ends[i] - self.origin for i in order]
        self.rates = [rates[i] for i in order]
        self.rate_sum = [0.0, *itertools.accumulate(self.rates)]  # [k]: of the first k
        self.work_sum = [0.0, *itertools.accumulate(r * e for r, e in zip(self.rates, self.ends))]
        inverse = [1 / r for r in self.rates]
        self.inverse_min = [math.inf, *itertools.accumulate(inverse, min)]  # [k]: of the first k
        tail = list(itertools.accumulate((e + v for e, v in zip(reversed(self.ends), reversed(inverse))), min))
        self.end_inverse_min = [*reversed(tail), math.inf]  # [k]: of those from k on

    def end_s(self, now: float, unassigned: int) -> float:
        """``round_end_s`` of the workers at ``now`` (same clock as ``ends``)."""
        t = now - self.origin
        n = len(self.ends)
        idle = bisect.bisect_right(self.ends, t)  # the first ``idle`` are free now: busy_s 0

        def busy(i: int) -> float:
            return self.ends[i] - t if i >= idle else 0.0

        def work(k: int) -> float:
            """``sum(rates[i] * busy(i))`` over the first k."""
            if k <= idle:
                return 0.0
            return self.work_sum[k] - self.work_sum[idle] - t * (self.rate_sum[k] - self.rate_sum[idle])

        # The first k >= 1 (k < n) at which the unassigned prompts are done
        # before worker k falls free: round_end_s's break.
        lo, hi = 1, n
        while lo < hi:
            k = (lo + hi) // 2
            if unassigned <= self.rate_sum[k] * busy(k) - work(k):
                hi = k
            else:
                lo = k + 1
        fluid = max(busy(lo - 1), (unassigned + work(lo)) / self.rate_sum[lo])
        longest = busy(n - 1)
        one_more = min(self.inverse_min[idle], self.end_inverse_min[idle] - t)
        return max(fluid, longest, one_more)


@dataclass(frozen=True)
class View:
    """The answers, as of one state of the pool and the peer book."""

    active: frozenset[str]  # peers that asked for work within the deadline
    proven: frozenset[str]  # those of them with an accepted batch
    newcomers_hold: int  # live prompts held by peers not in ``proven``
    unassigned: int  # PromptPool.unassigned
    round: RoundModel | None  # of the active peers with a measured rate; None: no such peer

    def round_ends_in_s(self, now: float) -> float | None:
        """Seconds from ``now`` (trio clock) until the round ends, None with no
        measured active peer. Seconds, not a time: trio's clock runs from a
        large random offset, and ``(now + x) - now`` came out a few 1e-9 short
        of ``x``, so that at 100 prompts a second no node was handed a
        round's last prompt and the step waited for ever (tests/test_swarm.py)."""
        return None if self.round is None else self.round.end_s(now, self.unassigned)


class Admission:
    """Keeps a ``View`` of ``pool`` and ``peers`` until something it depends on changes.

    ``within_s``: how recently a peer must have asked for work to count as
    active (the assignment deadline); the peer book must count a peer as
    back no later (``PeerBook.quiet_after_s``). ``group_size`` turns a
    peer's rollouts/s into prompts/s."""

    def __init__(self, pool: PromptPool, peers: PeerBook, *, within_s: float, group_size: int):
        if peers.quiet_after_s > within_s:
            raise ValueError("the peer book must see a peer come back within the active window")
        self.pool = pool
        self.peers = peers
        self.within_s = within_s
        self.group_size = group_size
        # (pool edits, peer revision, until (trio clock), until (wall clock), the view)
        self._kept: tuple[int, int, float, float, View] | None = None
        self.derived = 0  # views derived so far (tests, benches)

    def view(self) -> View:
        now, wall = trio.current_time(), time.time()
        if self._kept is not None:
            edits, revision, until, wall_until, kept = self._kept
            if edits == self.pool.edits and revision == self.peers.revision and now <= until and wall <= wall_until:
                return kept
        view, wall_until = self._derive(wall)
        # Live prompts change at the pool's next expiry, as its own tally does.
        self._kept = (self.pool.edits, self.peers.revision, self.pool.next_expiry(), wall_until, view)
        self.derived += 1
        return view

    def _derive(self, wall: float) -> tuple[View, float]:
        """The view now, and until when (wall clock) time leaves it true."""
        held, since = self.pool.held(), self.pool.held_since()
        active_stats = self.peers.active(self.within_s)
        proven = frozenset(s.peer for s in active_stats if s.accepted > 0)
        measured = [s for s in active_stats if s.rate > 0]
        round_model = None
        if measured:
            ends = []
            for s in measured:
                # sizing.Worker's busy_s is max(0, end - now): the end of what
                # it holds, or its latest answer when it holds nothing.
                holds = held[s.peer]
                start = max(since[s.peer], s.answered_at) if holds else s.answered_at
                ends.append(start + holds * self.group_size / s.rate)
            round_model = RoundModel(ends, [s.rate / self.group_size for s in measured])
        view = View(
            active=frozenset(s.peer for s in active_stats),
            proven=proven,
            newcomers_hold=sum(n for p, n in held.items() if p not in proven),
            unassigned=self.pool.unassigned(held),
            round=round_model,
        )
        # Quiet peers leave the active set, and whether a proven peer was
        # around lately decides who is provisional (``PromptPool.unassigned``).
        quiet_at = active_stats[0].last_seen + self.within_s if active_stats else math.inf
        proven_until = self.peers.proven_seen_at + self.within_s
        return view, min(quiet_at, proven_until if proven_until >= wall else math.inf)
