"""Broadcast scheduling as pure logic: no I/O, no clock of its own.

``Download`` decides, for one process fetching one version, which chunk to
request from which peer: rarest first (the chunk the fewest peers announce),
ties broken by a per-process random order so that processes spread out,
peers reached only through a relay only when no directly connected holder
is free, the seed (the learner) only when no other peer has the chunk, at most
``max_in_flight_per_peer`` requests per peer and ``max_in_flight`` in all.

``UploadPolicy`` decides which requests a process admits: a bounded queue,
and for the seed, a chunk that the swarm can relay
is uploaded again only after every chunk has been uploaded as often. The seed
thus pushes each chunk into the swarm once before it sends any chunk twice,
and the swarm does the relaying.

The real engine (``protocol.broadcast.engine``) and the simulator
(``bench/broadcast_sim.py``) both drive these two classes; time is whatever
``now`` they pass in.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulerConfig:
    # Two requests per peer keep a connection busy across the request's
    # round trip without piling up behind one slow peer.
    max_in_flight_per_peer: int = 2
    max_in_flight: int = 8
    # A busy peer (upload queue full) is asked again after this long, doubled
    # for each further busy answer in a row up to busy_backoff_max_s: each
    # refusal costs both sides a round trip of CPU.
    busy_backoff_s: float = 0.05
    busy_backoff_max_s: float = 1.0
    # A peer whose request failed (stalled, reset) is rested this long.
    failure_backoff_s: float = 1.0


@dataclass
class _Peer:
    chunks: frozenset[int] = frozenset()
    in_flight: int = 0
    banned: bool = False
    resting_until: float = 0.0
    # Chunks this peer told us to fetch elsewhere, until when.
    declined: dict[int, float] = field(default_factory=dict)
    busy_streak: int = 0


@dataclass
class Download:
    """The state of fetching one version's ``n_chunks`` chunks."""

    n_chunks: int
    have: set[int]
    seed: str | None = None
    config: SchedulerConfig = SchedulerConfig()
    rng: random.Random = field(default_factory=random.Random)
    peers: dict[str, _Peer] = field(default_factory=dict)
    in_flight: dict[int, str] = field(default_factory=dict)
    # How many usable (not banned) peers announce each chunk; kept up to date
    # incrementally so that next_requests stays cheap in large swarms.
    counts: Counter = field(default_factory=Counter)
    # Peers reached only through a relay: its bandwidth is shared and capped,
    # so they are asked last (the caller keeps this set up to date).
    relayed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        order = list(range(self.n_chunks))
        self.rng.shuffle(order)
        self._tiebreak = {idx: pos for pos, idx in enumerate(order)}

    def _set_chunks(self, state: _Peer, chunks: frozenset[int]) -> None:
        self.counts.update(chunks - state.chunks)
        self.counts.subtract(state.chunks - chunks)
        state.chunks = chunks

    @property
    def complete(self) -> bool:
        return len(self.have) == self.n_chunks

    # --- what peers tell us ------------------------------------------------------

    def update_peer(self, peer: str, chunks: frozenset[int]) -> None:
        """``peer`` announced that it holds ``chunks`` of this version."""
        state = self.peers.setdefault(peer, _Peer())
        if not state.banned:
            self._set_chunks(state, chunks)

    def remove_peer(self, peer: str) -> None:
        """``peer`` left; its open requests still end through ``on_failed``.

        A banned peer stays banned for this version even if it comes back.
        """
        state = self.peers.get(peer)
        if state is not None and not state.banned:
            self._set_chunks(state, frozenset())
            del self.peers[peer]

    # --- what to ask for -----------------------------------------------------------

    def next_requests(self, now: float) -> list[tuple[str, int]]:
        """Requests to start now; each is marked in flight until done or failed."""
        free = self.config.max_in_flight - len(self.in_flight)
        if free <= 0:
            return []
        usable = {
            p: s
            for p, s in self.peers.items()
            if not s.banned
            and s.resting_until <= now
            and s.in_flight < self.config.max_in_flight_per_peer
        }
        if not usable:
            return []
        counts = self.counts
        wanted = [
            idx
            for idx, n in counts.items()
            if n > 0 and idx not in self.have and idx not in self.in_flight
        ]
        wanted.sort(key=lambda idx: (counts[idx], self._tiebreak[idx]))
        out = []
        for idx in wanted:
            holders = [
                p for p, s in usable.items() if idx in s.chunks and s.declined.get(idx, 0.0) <= now
            ]
            if not holders:
                continue
            # A directly connected holder first, then the least busy; the seed
            # only breaks ties last, so that other peers take load first but
            # the seed's upload never idles.
            peer = min(
                holders,
                key=lambda p: (p in self.relayed, usable[p].in_flight, p == self.seed, self.rng.random()),
            )
            state = usable[peer]
            state.in_flight += 1
            if state.in_flight >= self.config.max_in_flight_per_peer:
                del usable[peer]
            self.in_flight[idx] = peer
            out.append((peer, idx))
            if len(out) == free or not usable:
                break
        return out

    def next_wakeup(self, now: float) -> float:
        """When a resting peer or declined chunk becomes usable again (``inf``: never)."""
        times = [
            t
            for s in self.peers.values()
            if not s.banned
            for t in (s.resting_until, *s.declined.values())
            if t > now
        ]
        return min(times, default=math.inf)

    # --- how requests end ----------------------------------------------------------

    def _finish(self, peer: str, idx: int) -> None:
        if self.in_flight.get(idx) == peer:
            del self.in_flight[idx]
        state = self.peers.get(peer)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1

    def on_done(self, peer: str, idx: int) -> None:
        """Chunk ``idx`` arrived from ``peer`` and matched its hash."""
        self._finish(peer, idx)
        self.have.add(idx)
        state = self.peers.get(peer)
        if state is not None:
            state.busy_streak = 0

    def on_failed(
        self,
        peer: str,
        idx: int,
        now: float,
        *,
        bad: bool = False,
        busy: bool = False,
        declined: bool = False,
    ) -> None:
        """The request failed.

        ``bad``: the chunk did not match its hash; the peer is banned for this
        version. ``busy``: the peer had no free upload slot; it rests a moment.
        ``declined``: the peer (the seed) wants this chunk fetched from others;
        we ask it for other chunks meanwhile. Otherwise (stall, reset, timeout)
        the peer rests longer.
        """
        self._finish(peer, idx)
        state = self.peers.get(peer)
        if state is None:
            return
        if bad:
            self._set_chunks(state, frozenset())
            state.banned = True
        elif declined:
            state.declined[idx] = now + self.config.busy_backoff_s
        elif busy:
            backoff = self.config.busy_backoff_s * 2 ** min(state.busy_streak, 10)
            state.resting_until = now + min(backoff, self.config.busy_backoff_max_s)
            state.busy_streak += 1
        else:
            state.resting_until = now + self.config.failure_backoff_s


@dataclass
class UploadPolicy:
    """Which chunk requests a process admits.

    Admitted requests wait in a FIFO queue for one of ``slots`` concurrent
    uploads (few slots: each chunk crosses a hop quickly, so relays can pass
    it on sooner). At most ``max_admitted`` are admitted at once; beyond that
    the answer is ``busy``.
    """

    n_chunks: int
    max_admitted: int
    is_seed: bool
    admitted: int = 0
    served: list[int] = field(default_factory=list)
    uploading: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.served = [0] * self.n_chunks

    def allow(self, idx: int, holders: int) -> str:
        """May this process serve chunk ``idx``? ``holders``: how many
        neighbours announce it.

        ``ok`` (admit it, then call ``finished``), ``busy`` (queue full) or
        ``ask_others``: the seed has pushed this chunk more often than some
        other chunk and the swarm can relay it (a neighbour holds it or is
        receiving it from us right now).
        """
        if self.admitted >= self.max_admitted:
            return "busy"
        if (
            self.is_seed
            and self.served[idx] > min(self.served)
            and (holders > 0 or self.uploading.get(idx, 0) > 0)
        ):
            return "ask_others"
        self.admitted += 1
        self.served[idx] += 1
        self.uploading[idx] = self.uploading.get(idx, 0) + 1
        return "ok"

    def finished(self, idx: int, *, ok: bool) -> None:
        self.admitted -= 1
        self.uploading[idx] -= 1
        if not ok:
            # The copy did not arrive: it does not count as pushed.
            self.served[idx] -= 1
