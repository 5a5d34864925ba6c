"""Broadcast scheduling as pure logic: no I/O, no clock of its own.

``Download`` decides, for one process fetching one version, which chunk to
request from which peer: rarest first (the chunk the fewest peers announce),
ties broken by a per-process random order so that processes spread out,
peers reached only through a relay only when no directly connected holder
is free, the seed (the learner) only when no other peer has the chunk, at most
``max_in_flight_per_peer`` requests per peer and ``max_in_flight`` in all.
Peers that have served us before are asked before strangers.
Endgame: once every missing chunk is requested, a request older than
``endgame_after_s`` is also sent to a holder that has proven it serves, so one
slow or stalling peer cannot hold up the version's last chunks. A peer that
stalls or sends a wrong chunk is dropped for the version.

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
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulerConfig:
    # Two requests per peer keep a connection busy across the request's
    # round trip without piling up behind one slow peer.
    max_in_flight_per_peer: int = 2
    max_in_flight: int = 8
    # A busy peer (upload queue full) is asked again after this long, doubled
    # for each further busy answer in a row up to busy_backoff_max_s: each
    # refusal costs both sides a round trip of CPU. A peer that has sent us
    # nothing of this version yet rests up to busy_stranger_max_s: one that
    # announces everything and only ever answers busy (slowly) otherwise held
    # a chunk every second.
    busy_backoff_s: float = 0.05
    busy_backoff_max_s: float = 1.0
    busy_stranger_max_s: float = 8.0
    # A peer whose request failed (reset, error) is rested this long.
    failure_backoff_s: float = 1.0
    # A chunk requested endgame_factor times the median request time ago
    # (endgame_after_s before any request has finished; at least
    # endgame_min_s) and still missing is asked of a second holder once
    # nothing else is left to request.
    endgame_after_s: float = 2.0
    endgame_factor: float = 4.0
    endgame_min_s: float = 0.25


@dataclass
class _Peer:
    chunks: frozenset[int] = frozenset()
    in_flight: int = 0
    banned: bool = False
    resting_until: float = 0.0
    # Chunks this peer told us to fetch elsewhere, until when.
    declined: dict[int, float] = field(default_factory=dict)
    busy_streak: int = 0
    delivered: int = 0  # chunks of this version it sent us


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
    # Endgame copies: chunk -> the second peer asked for it.
    duplicates: dict[int, str] = field(default_factory=dict)
    requested_at: dict[int, float] = field(default_factory=dict)
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=32))  # of finished requests
    # How many usable (not banned) peers announce each chunk; kept up to date
    # incrementally so that next_requests stays cheap in large swarms.
    counts: Counter = field(default_factory=Counter)
    # Peers reached only through a relay: its bandwidth is shared and capped,
    # so they are asked last (the caller keeps this set up to date).
    relayed: set[str] = field(default_factory=set)
    # Peers that have sent us a good chunk before (of any version): asked
    # before peers that never have, which may announce chunks they never send.
    trusted: set[str] = field(default_factory=set)
    # (resting until, busy streak) of peers that answered only busy in the
    # previous version (its ``busy_strangers()``): a peer that announces
    # everything and never serves must not start each version afresh.
    rested: dict[str, tuple[float, int]] = field(default_factory=dict)

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
        state = self._state(peer)
        if not state.banned:
            self._set_chunks(state, chunks)

    def drop(self, peer: str) -> None:
        """Ask ``peer`` for nothing more of this version, whatever it announces."""
        state = self._state(peer)
        self._set_chunks(state, frozenset())
        state.banned = True

    def _state(self, peer: str) -> _Peer:
        state = self.peers.get(peer)
        if state is None:
            state = self.peers[peer] = _Peer()
            state.resting_until, state.busy_streak = self.rested.get(peer, (0.0, 0))
        return state

    def busy_strangers(self) -> dict[str, tuple[float, int]]:
        """(resting until, busy streak) of each peer that answered busy and has
        sent nothing of this version: the next version's ``rested``."""
        return {
            p: (s.resting_until, s.busy_streak) for p, s in self.peers.items() if s.busy_streak and not s.delivered
        }

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
        free = self.config.max_in_flight - len(self.in_flight) - len(self.duplicates)
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
            if n > 0 and idx not in self.have and idx not in self.in_flight and idx not in self.duplicates
        ]
        wanted.sort(key=lambda idx: (counts[idx], self._tiebreak[idx]))
        out: list[tuple[str, int]] = []
        for idx in wanted:
            peer = self._pick(idx, usable, now)
            if peer is None:
                continue
            self._start(peer, idx, usable, now)
            self.in_flight[idx] = peer
            out.append((peer, idx))
            if len(out) == free or not usable:
                return out
        if not wanted:
            # Endgame: nothing left to ask for the first time.
            for idx, first in sorted(self.in_flight.items(), key=lambda kv: self.requested_at[kv[0]]):
                too_young = now - self.requested_at[idx] < self.endgame_after_s
                if too_young or idx in self.duplicates or idx in self.have:
                    continue
                peer = self._pick(idx, {p: s for p, s in usable.items() if p != first}, now, endgame=True)
                if peer is None:
                    continue
                self._start(peer, idx, usable, now)
                self.duplicates[idx] = peer
                out.append((peer, idx))
                if len(out) == free or not usable:
                    break
        return out

    def _pick(self, idx: int, usable: dict[str, _Peer], now: float, endgame: bool = False) -> str | None:
        holders = [p for p, s in usable.items() if idx in s.chunks and s.declined.get(idx, 0.0) <= now]
        if not holders:
            return None
        if endgame:
            # A copy goes only to a holder that has proven it serves: one that
            # sent us a chunk of this version, or the seed. Another peer that
            # only announces the chunk may be stalling too.
            proven = [p for p in holders if usable[p].delivered or p == self.seed]
            if not proven:
                return None
            return min(proven, key=lambda p: (p == self.seed, usable[p].in_flight, self.rng.random()))
        # A directly connected holder first, then one that has served us
        # before (a stranger only while those are at their request limit),
        # then the least busy; the seed only breaks ties last, so that other
        # peers take load first but the seed's upload never idles.
        return min(
            holders,
            key=lambda p: (
                p in self.relayed,
                bool(self.trusted) and p not in self.trusted,
                usable[p].in_flight,
                p == self.seed,
                self.rng.random(),
            ),
        )

    def _start(self, peer: str, idx: int, usable: dict[str, _Peer], now: float) -> None:
        state = usable[peer]
        state.in_flight += 1
        if state.in_flight >= self.config.max_in_flight_per_peer:
            del usable[peer]
        self.requested_at.setdefault(idx, now)

    @property
    def endgame_after_s(self) -> float:
        """How old a request must be before the endgame copies it."""
        c = self.config
        if not self.durations:
            return c.endgame_after_s
        return max(c.endgame_min_s, c.endgame_factor * statistics.median(self.durations))

    def next_wakeup(self, now: float) -> float:
        """When a resting peer or declined chunk becomes usable again, or a
        request becomes old enough for an endgame copy (``inf``: never)."""
        times = [
            t
            for s in self.peers.values()
            if not s.banned
            for t in (s.resting_until, *s.declined.values())
            if t > now
        ]
        times += [
            self.requested_at[idx] + self.endgame_after_s
            for idx in self.in_flight
            if idx not in self.duplicates and self.requested_at[idx] + self.endgame_after_s > now
        ]
        return min(times, default=math.inf)

    # --- how requests end ----------------------------------------------------------

    def _finish(self, peer: str, idx: int) -> None:
        if self.in_flight.get(idx) == peer:
            del self.in_flight[idx]
            if idx in self.duplicates:  # the endgame copy carries on as the request
                self.in_flight[idx] = self.duplicates.pop(idx)
        elif self.duplicates.get(idx) == peer:
            del self.duplicates[idx]
        if idx not in self.in_flight:
            self.requested_at.pop(idx, None)
        state = self.peers.get(peer)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1

    def on_done(self, peer: str, idx: int, now: float | None = None) -> None:
        """Chunk ``idx`` arrived from ``peer`` (at ``now``) and matched its hash."""
        if now is not None and self.in_flight.get(idx) == peer and idx not in self.duplicates:
            self.durations.append(now - self.requested_at[idx])
        self._finish(peer, idx)
        self.have.add(idx)
        state = self.peers.get(peer)
        if state is not None:
            state.busy_streak = 0
            state.delivered += 1

    def on_failed(
        self,
        peer: str,
        idx: int,
        now: float,
        *,
        bad: bool = False,
        busy: bool = False,
        declined: bool = False,
        stalled: bool = False,
    ) -> None:
        """The request failed.

        ``bad``: the chunk did not match its hash (or the peer denied holding a
        chunk it announced); ``stalled``: no byte came for too long. Either way
        the peer is dropped for this version, except a seed that stalls: it
        is the learner, busy rather than hostile, and may be the only holder,
        so it rests like a failed peer. ``busy``: the peer had no free upload
        slot; it rests a moment.
        ``declined``: the peer (the seed) wants this chunk fetched from others;
        we ask it for other chunks meanwhile. Otherwise (reset, error) the peer
        rests longer.
        """
        self._finish(peer, idx)
        state = self.peers.get(peer)
        if state is None:
            return
        if bad or (stalled and peer != self.seed):
            self.drop(peer)
        elif declined:
            state.declined[idx] = now + self.config.busy_backoff_s
        elif busy:
            backoff = self.config.busy_backoff_s * 2 ** min(state.busy_streak, 10)
            cap = self.config.busy_backoff_max_s if state.delivered else self.config.busy_stranger_max_s
            state.resting_until = now + min(backoff, cap)
            state.busy_streak += 1
        else:
            state.resting_until = now + self.config.failure_backoff_s


MAX_ADVISED = 65536


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
    advised: set[tuple[str, int]] = field(default_factory=set)  # (peer, chunk) told ask_others

    def __post_init__(self) -> None:
        self.served = [0] * self.n_chunks

    def allow(self, idx: int, holders: int, peer: str = "") -> str:
        """May this process serve chunk ``idx`` (to ``peer``)? ``holders``: how
        many neighbours announce it.

        ``ok`` (admit it, then call ``finished``), ``busy`` (queue full) or
        ``ask_others``: the seed has pushed this chunk more often than some
        other chunk and the swarm can relay it (a neighbour holds it or is
        receiving it from us right now). That is advice, given each peer once
        per chunk: a peer that asks again found no one else to serve it (the
        neighbours that announce the chunk may be lying).
        """
        if self.admitted >= self.max_admitted:
            return "busy"
        if (
            self.is_seed
            and self.served[idx] > min(self.served)
            and (holders > 0 or self.uploading.get(idx, 0) > 0)
            and (peer, idx) not in self.advised
        ):
            if len(self.advised) >= MAX_ADVISED:  # bounded; forgetting only means advising again
                self.advised.clear()
            self.advised.add((peer, idx))
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
