"""Uploading as pure logic: which requests a process admits, and in what order
it serves them. No I/O; driven by the real engine (``serving.ChunkServer``)
and by the simulator (``bench/broadcast_sim.py``).

``UploadPolicy`` admits requests up to a bound; for the seed it runs rounds:
it offers (announces) only the chunks not yet sent in the current round, so
each chunk enters the swarm once before any goes twice, and in the first
round it serves only peers that can relay (not peers reached through a relay,
whose uplink is capped). The swarm does the relaying. ``UploadQueue`` orders
the admitted requests: the requester furthest behind first, or for the seed
the requester it has sent the fewest chunks. Free riders (``reciprocity``)
are admitted a few at a time and never wait for, nor hold, an upload slot:
they are paced by a bucket of their own, so peers that redistribute never
wait behind them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_REQUESTERS = 4096


@dataclass
class UploadPolicy:
    """Which chunk requests a process admits.

    Admitted requests wait in the ``UploadQueue`` for one of a few concurrent
    uploads (few: each chunk crosses a hop quickly, so relays can pass it on
    sooner). At most ``max_admitted`` are admitted at once; beyond that the
    answer is ``busy``.

    The seed works in rounds. It announces only the chunks not yet sent in
    the current round (``offered``), so requesters ask it for chunks the swarm
    lacks rather than copies of what is already relayed (BitTorrent's
    super-seeding); a chunk that leaves with the only peer holding it comes
    back in the next round. It admits every neighbour's requests and serves
    first the requester it has sent the fewest chunks. In its first round it
    turns away peers reached only through a relay (``weak``: their uplink is
    capped, so a chunk given only to them spreads slowly) while it is serving
    any other peer, so they are never starved. A requester that asks again
    for a chunk it was told to fetch elsewhere gets it: it found no other
    peer to fetch it from (its holders left, or it dropped them), and the
    round that would offer the chunk again may never come (it ends only
    once each chunk has gone out once more, and nobody else may want one).

    Free riders (``reciprocity.Standing``: peers that pass nothing on) are
    admitted ``max_free_admitted`` at a time, all of them together, so that a
    crowd of leeching identities takes one requester's place, not the queue.
    Neither their copies nor the seed's copies to a peer that does not work
    for the job (``counted`` False) count in its rounds.
    """

    n_chunks: int
    max_admitted: int
    is_seed: bool
    max_free_admitted: int = 2
    admitted: int = 0
    free_admitted: int = 0
    served: list[int] = field(default_factory=list)  # copies of each chunk sent or being sent
    delivered: list[int] = field(default_factory=list)  # copies of each chunk sent in full

    def __post_init__(self) -> None:
        self.served = [0] * self.n_chunks
        self.delivered = [0] * self.n_chunks
        # Round r: every chunk has been sent r times in full; the seed offers
        # the chunks with no copy sent or on its way in this round. The next
        # round starts only once the last copy of this one has gone out, so
        # that second copies do not share the uplink with the last first ones.
        self._round = 0
        self._behind = self.n_chunks  # chunks delivered only ``_round`` times
        self._offered = frozenset(range(self.n_chunks))
        self._sent_to: dict[str, int] = {}  # the seed: chunks admitted per requester
        self._strong_admitted = 0  # admitted requests from peers not reached through a relay
        self._declined: dict[str, set[int]] = {}  # the seed: chunks each requester was told to fetch elsewhere

    def offered(self) -> frozenset[int]:
        """The chunks to announce: all of them, or for the seed those not yet
        sent in this round."""
        return self._offered

    def _next_round(self) -> None:
        self._round = min(self.delivered)
        self._behind = sum(1 for n in self.delivered if n == self._round)
        self._offered = frozenset(i for i, n in enumerate(self.served) if n == self._round)

    def priority(self, peer: str, shared: int) -> int:
        """Where a request admitted for ``peer`` waits in the ``UploadQueue``.

        A relay serves first the requester that holds fewest of the chunks
        it holds (``shared``, from the requester's Have): the one furthest
        behind, so that nobody falls back in the swarm. (Serving the rarest
        chunk first instead let nodes with weak neighbourhoods fall further
        behind, since what they miss is common: simulator, 300 nodes, the
        heterogeneous tail 1.39 -> 1.28 x Kumar-Ross and equal links 1.18 ->
        1.14 x.) The seed serves first the requester it has sent fewer
        chunks, so that fresh chunks spread evenly over the peers that relay
        them."""
        return self._sent_to.get(peer, 0) if self.is_seed else shared

    def allow(self, idx: int, peer: str = "", weak: bool = False, free: bool = False, counted: bool = True) -> str:
        """May this process serve chunk ``idx`` to ``peer`` now? ``weak``:
        ``peer`` is reached only through a relay; ``free``: it is a free rider;
        ``counted``: for the seed, a copy to ``peer`` counts in its rounds
        (False: ``peer`` does not work for the job; see below).

        ``ok`` (admit it, then call ``finished`` with the same ``weak``,
        ``free`` and ``counted``), ``busy`` (queue full; the free riders' places taken; or the
        seed's first round, a weak requester and another one being served) or ``ask_others``: the seed has pushed this
        chunk in this round already (it no longer offers it; the requester saw
        an older Have) and the swarm relays it. A chunk whose holders left, or
        lie about holding it, comes from the seed when the requester asks for
        it again, or in the next round, when the seed offers it again.
        """
        if self.admitted >= self.max_admitted or free and self.free_admitted >= self.max_free_admitted:
            return "busy"
        if free:
            # A copy that will not be passed on: it takes no part in the
            # seed's rounds. (Counted in, a leecher that asked first for a
            # fresh chunk made the seed tell every honest peer ``ask_others``
            # while no honest peer held it: versions stalled.)
            self.admitted += 1
            self.free_admitted += 1
            self._strong_admitted += not weak
            return "ok"
        if self.is_seed and weak and self._round == 0 and self._strong_admitted:
            return "busy"
        if self.is_seed and self.served[idx] > self._round:
            if idx not in self._declined.get(peer, ()):
                if peer not in self._declined and len(self._declined) >= MAX_REQUESTERS:
                    self._declined.clear()  # bounded; forgetting costs one more round trip
                self._declined.setdefault(peer, set()).add(idx)
                return "ask_others"
            self._declined[peer].discard(idx)  # asked again: nobody else could send it
        self.admitted += 1
        self._strong_admitted += not weak
        if not counted:
            # A peer that does not work for the job may never pass the copy
            # on: served in full, but not as the round's copy. (Counted in,
            # a leecher under a fresh identity every 5 s took the round's
            # first copies of each new version with its newcomer's credit,
            # and the seed told the honest nodes ``ask_others`` while no
            # honest peer held those chunks: a node waited seed_retry_s,
            # 2 s, at most versions; sync, bench/attacks.py empty_have_leech.)
            return "ok"
        self.served[idx] += 1
        if self.is_seed:
            if len(self._sent_to) >= MAX_REQUESTERS and peer not in self._sent_to:
                self._sent_to.clear()  # bounded; forgetting only costs fairness
            self._sent_to[peer] = self._sent_to.get(peer, 0) + 1
            if idx in self._offered:
                self._offered = self._offered - {idx}
        return "ok"

    def finished(self, idx: int, *, ok: bool, weak: bool = False, free: bool = False, counted: bool = True) -> None:
        self.admitted -= 1
        self.free_admitted -= free
        self._strong_admitted -= not weak
        if free or not counted:
            return
        if not ok:
            # The copy did not arrive: it does not count as sent.
            self.served[idx] -= 1
            if self.is_seed and self.served[idx] == self._round:
                self._offered = self._offered | {idx}
            return
        self.delivered[idx] += 1
        if self.is_seed and self.delivered[idx] == self._round + 1:
            self._behind -= 1
            if self._behind == 0:
                self._next_round()


@dataclass
class UploadQueue:
    """Admitted uploads of one process wait here for one of ``slots``.

    Lower ``priority`` first, within a bound: a request pushed with priority
    p lets at most p requests that came after it go ahead, so none waits long
    enough to time out. A relay's priority is how many of its chunks the
    requester holds; the seed's, how many chunks it sent the requester
    (``UploadPolicy.priority``). Items are whatever the caller uses to start
    an upload; ``pop_ready`` hands out those that may start now.
    """

    slots: int
    active: int = 0
    _waiting: list[tuple[int, int, int, Any]] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)

    def push(self, priority: int, item: Any) -> None:
        seq = next(self._seq)
        heapq.heappush(self._waiting, (seq + priority, priority, seq, item))

    def remove(self, item: Any) -> None:
        """``item`` gave up waiting (its request was cancelled)."""
        self._waiting = [w for w in self._waiting if w[-1] is not item]
        heapq.heapify(self._waiting)

    def pop_ready(self) -> list[Any]:
        """Items that may start now; each must end with ``done``."""
        out = []
        while self._waiting and self.active < self.slots:
            out.append(heapq.heappop(self._waiting)[-1])
            self.active += 1
        return out

    def done(self) -> None:
        self.active -= 1

    def waiting(self) -> list[Any]:
        return [w[-1] for w in self._waiting]

    def __len__(self) -> int:
        return len(self._waiting)
