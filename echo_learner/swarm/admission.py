"""What every work request asks of the swarm, derived once per change.

Each work request asks the same questions: which peers asked for work
recently and which of them have had a batch accepted (``fairness``), how many
prompts the newcomers hold between them, how many prompts of the round are
still to be handed out, and when the round ends in the learner's model of it
(``sizing.round_end_s``). Answered afresh, each is a scan of the active
peers; and every change of the pool wakes up to ``--max-waiting-requests``
requests that all ask again. At 1,000 identities that was 187 ms of learner
CPU per accepted batch (docs/learner.md, "Many volunteers").

``Admission.view`` keeps the answers while nothing they depend on has
changed: the pool's assignments and buffer (``PromptPool.edits``), the peer
book (``PeerBook.revision``: a peer new, forgotten, back after a quiet spell,
or with a new verdict), and time only where time changes them (the next
prompt to expire, the next peer to fall quiet, the last proven peer falling
quiet). After a change it brings them up to date peer by peer, for the peers
the pool and the peer book say changed (``Changes``) and those fallen quiet,
rather than rescanning every peer: a change of the pool (once per work
request at least) costs 1.08 ms of learner CPU at 1,000 peers derived
afresh and 0.18 ms this way (``bench/admission_cost.py``). The answers are exactly what a
full recomputation gives at the same moment (tests/learner/test_admission.py
checks every figure against one). The round's end depends on the moment as
well; ``RoundModel`` holds the round sorted so that it is answered for any
moment in O(log n), and ``Workers`` keeps it sorted as workers change.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import trio

from echo_learner.swarm.peers import PeerBook, PeerStats
from echo_learner.swarm.pool import PromptPool


class RoundModel:
    """``sizing.round_end_s`` for any moment, from the workers' absolute
    finishing times: each measured worker works through what it holds until
    ``ends[i]`` (a time on one clock) at ``rates[i]`` prompts a second.

    ``round_end_s`` water-fills the unassigned prompts onto the workers in
    the order they fall free and stops at the first worker whose free time
    the fluid finish does not reach; with the workers sorted once, that
    worker is a binary search on prefix sums, and the two bounds it is
    compared with are prefix and suffix minima. Equal to ``round_end_s`` up
    to float rounding. Built with numpy: a learner builds one at every
    change of the pool, over every measured peer."""

    def __init__(self, ends: list[float] | np.ndarray, rates: list[float] | np.ndarray, *, is_sorted: bool = False):
        ends, rates = np.asarray(ends, dtype=np.float64), np.asarray(rates, dtype=np.float64)
        assert len(ends) and len(ends) == len(rates) and bool((rates > 0).all())
        if not is_sorted:
            order = np.argsort(ends, kind="stable")
            ends, rates = ends[order], rates[order]
        # Anchored at the first end, so that sums of rate x time stay small.
        self.origin = float(ends[0])
        self.ends = ends - self.origin
        inverse = 1 / rates
        self.rate_sum = np.concatenate(([0.0], np.cumsum(rates)))  # [k]: of the first k
        self.work_sum = np.concatenate(([0.0], np.cumsum(rates * self.ends)))
        self.inverse_min = np.concatenate(([math.inf], np.minimum.accumulate(inverse)))  # [k]: of the first k
        tail = np.minimum.accumulate((self.ends + inverse)[::-1])
        self.end_inverse_min = np.concatenate((tail[::-1], [math.inf]))  # [k]: of those from k on

    def end_s(self, now: float, unassigned: int) -> float:
        """``round_end_s`` of the workers at ``now`` (same clock as ``ends``)."""
        t = now - self.origin
        n = len(self.ends)
        idle = int(np.searchsorted(self.ends, t, side="right"))  # the first ``idle`` are free now: busy_s 0

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
        return float(max(fluid, longest, one_more))


class Workers:
    """The measured workers' ends and rates (prompts/s), kept sorted by end
    as they change one by one, and their ``RoundModel``, built again only
    after a change."""

    def __init__(self, workers: dict[str, tuple[float, float]] | None = None) -> None:
        """``workers``: each one's (end, rate) to start with."""
        workers = workers or {}
        self._names = sorted(workers, key=lambda w: workers[w][0])  # by end
        self._ends = np.array([workers[w][0] for w in self._names], dtype=np.float64)
        self._rates = np.array([workers[w][1] for w in self._names], dtype=np.float64)
        self._end_of = {w: end for w, (end, _) in workers.items()}
        self._model: RoundModel | None = None

    def __len__(self) -> int:
        return len(self._names)

    # Slices joined, not np.insert / np.delete: their argument handling cost
    # more than moving 1,000 floats (the learner does this at every change).

    def set(self, worker: str, end: float, rate: float) -> None:
        self.remove(worker)
        i = int(self._ends.searchsorted(end, side="right"))
        self._ends = np.concatenate((self._ends[:i], (end,), self._ends[i:]))
        self._rates = np.concatenate((self._rates[:i], (rate,), self._rates[i:]))
        self._names.insert(i, worker)
        self._end_of[worker] = end
        self._model = None

    def remove(self, worker: str) -> None:
        end = self._end_of.pop(worker, None)
        if end is None:
            return
        i = self._names.index(worker, int(self._ends.searchsorted(end, side="left")))
        self._ends = np.concatenate((self._ends[:i], self._ends[i + 1 :]))
        self._rates = np.concatenate((self._rates[:i], self._rates[i + 1 :]))
        del self._names[i]
        self._model = None

    def model(self) -> RoundModel | None:
        """None while there is no worker."""
        if self._model is None and self._names:
            self._model = RoundModel(self._ends, self._rates, is_sorted=True)
        return self._model


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
    peer's rollouts/s into prompts/s.

    Between views it keeps the active and proven peers and each measured
    worker's end, and brings them up to date peer by peer: the peers whose
    live prompts or stats changed (``Changes``), and those fallen quiet since
    (a heap by the time they were last seen)."""

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
        self._active: dict[str, float] = {}  # active peer -> when it was last seen
        self._proven: set[str] = set()
        self._workers = Workers()  # the measured active peers
        self._quiet: list[tuple[float, str]] = []  # (last seen, peer) of active peers; stale ones skipped
        # Live prompts held by each peer outside ``_proven``, and their sum.
        self._outside: dict[str, int] = {}
        self._outside_hold = 0

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
        held, since = self.pool.held(), self.pool.held_since()  # expired prompts are noted as changes here
        cutoff = wall - self.within_s
        from_pool, from_peers = self.pool.changes.take(), self.peers.changes.take()
        if from_pool is None or from_peers is None:
            self._start_over(held, since, cutoff)
        else:
            changed = from_pool | from_peers
            while self._quiet and self._quiet[0][0] < cutoff:
                seen_at, peer = heapq.heappop(self._quiet)
                if self._active.get(peer) == seen_at:  # else seen since: a later entry stands for it
                    changed.add(peer)
            for peer in changed:
                self._update(peer, held, since, cutoff)
                self._count_outside(peer, held)
            if len(self._quiet) > 2 * len(self._active) + 64:  # mostly stale entries
                self._heap_active()

        view = View(
            active=frozenset(self._active),
            proven=frozenset(self._proven),
            newcomers_hold=self._outside_hold,
            unassigned=self.pool.unassigned(held),
            round=self._workers.model(),
        )
        # Quiet peers leave the active set, and whether a proven peer was
        # around lately decides who is provisional (``PromptPool.unassigned``).
        while self._quiet and self._active.get(self._quiet[0][1]) != self._quiet[0][0]:
            heapq.heappop(self._quiet)  # stale: seen since, or gone
        quiet_at = self._quiet[0][0] + self.within_s if self._quiet else math.inf
        proven_until = self.peers.proven_seen_at + self.within_s
        return view, min(quiet_at, proven_until if proven_until >= wall else math.inf)

    def _start_over(self, held: Counter[str], since: dict[str, float], cutoff: float) -> None:
        """Everything from every peer (at the start, at a new round, or when
        too much changed to say peer by peer)."""
        active = [s for s in self.peers.peers.values() if s.last_seen >= cutoff]
        self._active = {s.peer: s.last_seen for s in active}
        self._proven = {s.peer for s in active if s.accepted > 0}
        self._workers = Workers({s.peer: self._worker(s, held, since) for s in active if s.rate > 0})
        self._heap_active()
        self._outside = {p: n for p, n in held.items() if n and p not in self._proven}
        self._outside_hold = sum(self._outside.values())

    def _count_outside(self, peer: str, held: Counter[str]) -> None:
        """``peer``'s share of ``newcomers_hold`` after a change of its
        prompts or of whether it is proven (the only two it depends on)."""
        n = 0 if peer in self._proven else held[peer]
        self._outside_hold += n - self._outside.pop(peer, 0)
        if n:
            self._outside[peer] = n

    def _heap_active(self) -> None:
        """The quiet heap afresh: one entry per active peer."""
        self._quiet = [(seen_at, peer) for peer, seen_at in self._active.items()]
        heapq.heapify(self._quiet)

    def _worker(self, s: PeerStats, held: Counter[str], since: dict[str, float]) -> tuple[float, float]:
        """The measured peer ``s`` as a worker: when it falls free, and its prompts a second."""
        # sizing.Worker's busy_s is max(0, end - now): the end of what it
        # holds, or its latest answer when it holds nothing.
        holds = held[s.peer]
        start = max(since[s.peer], s.answered_at) if holds else s.answered_at
        return start + holds * self.group_size / s.rate, s.rate / self.group_size

    def _update(self, peer: str, held: Counter[str], since: dict[str, float], cutoff: float) -> None:
        """Bring what is kept of ``peer`` up to date."""
        s = self.peers.peers.get(peer)
        if s is None or s.last_seen < cutoff:  # forgotten, or quiet
            self._active.pop(peer, None)
            self._proven.discard(peer)
            self._workers.remove(peer)
            return
        if self._active.get(peer) != s.last_seen:
            self._active[peer] = s.last_seen
            heapq.heappush(self._quiet, (s.last_seen, peer))
        if s.accepted > 0:
            self._proven.add(peer)
        else:
            self._proven.discard(peer)
        if s.rate > 0:
            self._workers.set(peer, *self._worker(s, held, since))
        else:
            self._workers.remove(peer)
