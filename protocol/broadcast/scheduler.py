"""Broadcast scheduling as pure logic: no I/O, no clock of its own.

``Download`` decides, for one process fetching one version, which chunk to
request from which peer: rarest first (the chunk the fewest peers announce),
ties broken by a per-process random order so that processes spread out; from
the holder expected to deliver it soonest, by the throughput each peer has
given us (peers reached only through a relay only when no directly connected
holder is free); at most ``max_in_flight_per_peer`` requests per peer and
``max_in_flight`` in all. Peers that have served us before are asked before
strangers, and strangers get few requests (they may announce chunks they
never send). Each peer's record over every version (``PeerRecords``) puts
a *doubtful* peer last and sends the chunks only such peers announce to the
seed. A request with no answer after a few typical request times
(``request_timeout``) is abandoned and its peer dropped for the version.
Endgame: once every missing chunk is requested, a request older than
``endgame_after_s`` is also sent to a holder that has proven it serves, so one
slow or stalling peer cannot hold up the version's last chunks. A peer that
stalls or sends a wrong chunk is dropped for the version. The seed holds every
chunk: one that no usable peer announces (the seed sent it to others this
round and they left, or we dropped them) is asked of the seed anyway after
``seed_retry_s``, so a version always completes while the seed answers.

The uploading side is ``protocol.broadcast.uploads``. The real engine
(``protocol.broadcast.engine``) and the simulator (``bench/broadcast_sim.py``)
both drive these classes; time is whatever ``now`` they pass in.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field

from protocol.broadcast.records import PeerRecords


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
    # Good chunks a peer must have sent us (of any version, ``PeerRecords``)
    # to be asked before peers with fewer, and for a request to it to be
    # copied no sooner than others: a trickler's one good chunk earned it the
    # same first place as honest peers that had sent hundreds (issue 55).
    proven_chunks: int = 3
    # A peer whose request failed (reset, error) is rested this long.
    failure_backoff_s: float = 1.0
    # A chunk the seed declined (ask_others: it went out in the seed's round
    # and the swarm relays it) is asked of the seed again after this long if
    # still missing and no usable peer announces it, whether or not the seed
    # offers it; the seed serves a chunk a requester asks for twice
    # (uploads.UploadPolicy). Likewise a chunk nobody announces this long into
    # the download. Without it a node that had dropped every other holder
    # (stalls, on a busy machine) waited for the next version: its assigned
    # prompts lapsed meanwhile (bench/convergence.py, sync, 72 s pauses).
    # Well above a relay hop, so the seed still sends about one copy.
    seed_retry_s: float = 2.0
    # A chunk requested endgame_factor times the median request time ago
    # (endgame_after_s before any request has finished; at least
    # endgame_min_s) and still missing is asked of a second holder once
    # nothing else is left to request.
    endgame_after_s: float = 2.0
    endgame_factor: float = 4.0
    endgame_min_s: float = 0.25
    # A peer that has not yet sent us a chunk of this version, and never any
    # chunk before, gets at most this many requests, and all such peers
    # together at most max_stranger_requests: a peer that announces every
    # chunk and sends none then holds few of our requests while it times out.
    max_in_flight_per_stranger: int = 1
    max_stranger_requests: int = 4
    # A request with no answer after timeout_factor times its expected
    # duration (the peer's measured throughput, else the median request
    # time; timeout_initial_s before anything is measured), clamped to
    # [timeout_min_s, timeout_max_s], is abandoned as a stall.
    timeout_factor: float = 4.0
    timeout_initial_s: float = 3.0
    timeout_min_s: float = 2.0
    timeout_max_s: float = 10.0
    # Weight of the newest sample in a peer's throughput average.
    speed_weight: float = 0.3


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
    # Chunks per second this peer has given us (moving average; 0: not yet
    # measured), and when each open request to it started.
    speed: float = 0.0
    started: dict[int, float] = field(default_factory=dict)


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
    # Each peer's record with us over every version (good chunks, failed
    # requests): the engine's, shared by all its versions' downloads.
    records: PeerRecords = field(default_factory=PeerRecords)
    # (resting until, busy streak) of peers that answered only busy in the
    # previous version (its ``busy_strangers()``): a peer that announces
    # everything and never serves must not start each version afresh.
    rested: dict[str, tuple[float, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._typical_s = 0.0  # the median of durations
        self._started: float | None = None  # the first next_requests call
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
        return {p: (s.resting_until, s.busy_streak) for p, s in self.peers.items() if s.busy_streak and not s.delivered}

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
        if self._started is None:
            self._started = now
        free = self.config.max_in_flight - len(self.in_flight) - len(self.duplicates)
        if free <= 0:
            return []
        usable = {
            p: s
            for p, s in self.peers.items()
            if not s.banned and s.resting_until <= now and s.in_flight < self._limit(p, s)
        }
        self._cap_strangers(usable)
        if not usable:
            return []
        counts = self.counts
        doubtful_only = self._held_by_doubtful_only()
        wanted = [
            idx
            for idx, n in counts.items()
            if n > 0
            and idx not in doubtful_only
            and idx not in self.have
            and idx not in self.in_flight
            and idx not in self.duplicates
        ]
        wanted.sort(key=lambda idx: (counts[idx], self._tiebreak[idx]))
        typical = self._typical_speed()
        out: list[tuple[str, int]] = []
        for idx in wanted:
            peer = self._pick(idx, usable, now, typical)
            if peer is None:
                continue
            self._start(peer, idx, usable, now)
            self.in_flight[idx] = peer
            out.append((peer, idx))
            if len(out) == free or not usable:
                return out
        if self.seed in usable:
            orphans = self._orphans(doubtful_only)
            due = sorted((idx for idx, t in orphans.items() if t <= now), key=self._tiebreak.__getitem__)
            for idx in due:
                self._start(self.seed, idx, usable, now)
                self.in_flight[idx] = self.seed
                out.append((self.seed, idx))
                if len(out) == free or self.seed not in usable:
                    return out
        if not wanted:
            # Endgame: nothing left to ask for the first time.
            for idx, first in sorted(self.in_flight.items(), key=lambda kv: self.requested_at[kv[0]]):
                too_young = now - self.requested_at[idx] < self._copy_after(first)
                if too_young or idx in self.duplicates or idx in self.have:
                    continue
                others = {p: s for p, s in usable.items() if p != first}
                peer = self._pick(idx, others, now, typical, endgame=True)
                if peer is None and self.seed in others and (first not in self.trusted or self._hedged(first)):
                    # The seed holds every chunk, announced or not, and
                    # serves one asked of it twice: a hedged peer's request
                    # goes to it, and a stranger's (which still runs on to
                    # its verdict, protocol.broadcast.requests), so that the
                    # version need not wait. Four strangers that announced
                    # every chunk and never sent one held each sync node's
                    # version for their whole timeout once each: 0.78 of the
                    # honest rate (bench/attacks.py stalling_chunk_peers,
                    # 2026-11-29). A proven peer's request is only slow: the
                    # seed's decline holds.
                    peer = self.seed
                if peer is None:
                    continue
                self._start(peer, idx, usable, now)
                self.duplicates[idx] = peer
                out.append((peer, idx))
                if len(out) == free or not usable:
                    break
        return out

    def _orphans(self, doubtful_only: set[int] | None = None) -> dict[int, float]:
        """Missing chunks no usable peer announces, each with when it is due
        to be asked of the seed: ``seed_retry_s`` into the download, and as
        long after the seed last declined it; a chunk that only doubtful peers
        announce, at once (the seed serves a chunk asked of it twice). Empty
        while the seed is unknown or dropped. ``doubtful_only``: those chunks,
        when the caller has them already."""
        state = self.peers.get(self.seed) if self.seed is not None else None
        if state is None or state.banned or self._started is None:
            return {}
        after = self._started + self.config.seed_retry_s
        if doubtful_only is None:
            doubtful_only = self._held_by_doubtful_only()
        return {
            idx: self._started if idx in doubtful_only else max(after, state.declined.get(idx, after))
            for idx in range(self.n_chunks)
            if (self.counts[idx] <= 0 or idx in doubtful_only)
            and idx not in self.have
            and idx not in self.in_flight
            and idx not in self.duplicates
        }

    def _held_by_doubtful_only(self) -> set[int]:
        """Chunks that some peer announces, but only doubtful ones: they go to
        the seed, not to a peer that sent one good chunk and then let our
        requests time out (a trickler that took the seed's one copy of a
        chunk held every node's download of it for a whole timeout, 5 s,
        where the seed asked again serves it at once: issue 55)."""
        doubtful = {p for p in self.peers if p != self.seed and self.records.doubtful(p)}
        seed = self.peers.get(self.seed) if self.seed is not None else None
        if seed is None or seed.banned or not doubtful:
            return set()
        held = set().union(*(s.chunks for s in self.peers.values() if not s.banned))
        good = set().union(*(s.chunks for p, s in self.peers.items() if not s.banned and p not in doubtful))
        return held - good

    def _hedged(self, peer: str) -> bool:
        """Is a request to ``peer`` copied by the endgame after one typical
        request time, not ``endgame_after_s``? So it is for a peer that has
        sent us a good chunk and is doubtful or not yet proven
        (``PeerRecords``): a trickler that took the seed's one copy of a
        chunk was otherwise its only other holder until the seed's decline
        ran out, and every node's download of the version waited (3.4 s)."""
        if peer == self.seed or peer not in self.trusted:
            return False
        return self.records.doubtful(peer) or not self.records.proven(peer, self.config.proven_chunks)

    def _stranger(self, peer: str, state: _Peer) -> bool:
        """Has ``peer`` never sent us a good chunk (and is not the seed)?"""
        return not state.delivered and peer not in self.trusted and peer != self.seed

    def _limit(self, peer: str, state: _Peer) -> int:
        c = self.config
        return c.max_in_flight_per_stranger if self._stranger(peer, state) else c.max_in_flight_per_peer

    def _cap_strangers(self, usable: dict[str, _Peer]) -> None:
        """Take strangers out of ``usable`` once they hold their share of our requests."""
        strangers = [p for p, s in self.peers.items() if self._stranger(p, s)]
        if sum(self.peers[p].in_flight for p in strangers) >= self.config.max_stranger_requests:
            for p in strangers:
                usable.pop(p, None)

    def _typical_speed(self) -> float:
        """The median measured throughput of our peers: what a peer not yet
        measured is assumed to give (1.0 when nothing is measured)."""
        speeds = [s.speed for s in self.peers.values() if s.speed and not s.banned]
        return statistics.median(speeds) if speeds else 1.0

    def _pick(
        self, idx: int, usable: dict[str, _Peer], now: float, typical: float, endgame: bool = False
    ) -> str | None:
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

        def expected_s(p: str) -> float:
            """When a new request to ``p`` should be done, at its measured rate."""
            state = usable[p]
            return (state.in_flight + 1) / (state.speed or typical)

        # A directly connected holder first, then one that has served us
        # before (a stranger only while those are at their request limit),
        # then one that is not doubtful, then one with a record of
        # proven_chunks, then the one expected to deliver soonest; the seed
        # only breaks ties last, so that other peers take load first.
        return min(
            holders,
            key=lambda p: (
                p in self.relayed,
                bool(self.trusted) and p not in self.trusted,
                p != self.seed and self.records.doubtful(p),
                not self.records.proven(p, self.config.proven_chunks),
                expected_s(p),
                p == self.seed,
                self.rng.random(),
            ),
        )

    def _start(self, peer: str, idx: int, usable: dict[str, _Peer], now: float) -> None:
        state = usable[peer]
        state.in_flight += 1
        state.started[idx] = now
        if state.in_flight >= self._limit(peer, state):
            del usable[peer]
        if self._stranger(peer, state):
            self._cap_strangers(usable)
        self.requested_at.setdefault(idx, now)

    def request_timeout(self, peer: str) -> float:
        """How long a request to ``peer`` may go unanswered before it counts as
        a stall: a few times what it should take at the rate ``peer`` has
        given us, or else at the typical request time.

        The seed queues every neighbour's requests (``UploadPolicy``), so a
        wait there grows with the swarm, and giving up on it only wastes the
        upload it was about to make: its timeout is never below
        ``timeout_max_s``. A relayed peer's capped share may be far below the
        typical peer's: it gets ``timeout_max_s`` until measured.
        """
        c = self.config
        state = self.peers.get(peer)
        if state is not None and state.speed:
            timeout = c.timeout_factor * max(1, state.in_flight) / state.speed
        elif peer in self.relayed or peer == self.seed:
            return c.timeout_max_s
        elif self.durations:
            timeout = c.timeout_factor * self._typical_s
        else:
            return c.timeout_initial_s
        if peer == self.seed:
            return max(c.timeout_max_s, timeout)
        return min(c.timeout_max_s, max(c.timeout_min_s, timeout))

    @property
    def endgame_after_s(self) -> float:
        """How old a request must be before the endgame copies it."""
        c = self.config
        if not self.durations:
            return c.endgame_after_s
        return max(c.endgame_min_s, c.endgame_factor * self._typical_s)

    def _copy_after(self, peer: str) -> float:
        """How old a request to ``peer`` must be before the endgame copies it:
        ``endgame_after_s``, or one typical request time when it is hedged
        (under load a typical request took 1.2 s, and four of them outlasted
        a trickler's whole timeout)."""
        if not self._hedged(peer):
            return self.endgame_after_s
        c = self.config
        return max(c.endgame_min_s, self._typical_s) if self.durations else c.endgame_after_s

    def next_wakeup(self, now: float) -> float:
        """When a resting peer or declined chunk becomes usable again, or a
        request becomes old enough for an endgame copy (``inf``: never)."""
        times = [
            t for s in self.peers.values() if not s.banned for t in (s.resting_until, *s.declined.values()) if t > now
        ]
        copies = (
            self.requested_at[idx] + self._copy_after(peer)
            for idx, peer in self.in_flight.items()
            if idx not in self.duplicates
        )
        times += [t for t in copies if t > now]
        times += [t for t in self._orphans().values() if t > now]  # then the seed's to send
        return min(times, default=math.inf)

    # --- how requests end ----------------------------------------------------------

    def _finish(self, peer: str, idx: int) -> None:
        state = self.peers.get(peer)
        if state is not None:
            state.started.pop(idx, None)
        if self.in_flight.get(idx) == peer:
            del self.in_flight[idx]
            if idx in self.duplicates:  # the endgame copy carries on as the request
                self.in_flight[idx] = self.duplicates.pop(idx)
        elif self.duplicates.get(idx) == peer:
            del self.duplicates[idx]
        if idx not in self.in_flight:
            self.requested_at.pop(idx, None)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1

    def on_done(self, peer: str, idx: int, now: float | None = None) -> None:
        """Chunk ``idx`` arrived from ``peer`` (at ``now``) and matched its hash."""
        if now is not None and self.in_flight.get(idx) == peer and idx not in self.duplicates:
            self.durations.append(now - self.requested_at[idx])
            self._typical_s = statistics.median(self.durations)
        state = self.peers.get(peer)
        started = state.started.get(idx) if state is not None else None
        if state is not None and now is not None and started is not None and now > started:
            # Requests to one peer share its upload: n open requests that each
            # took t seconds mean n / t chunks per second.
            sample = max(1, state.in_flight) / (now - started)
            w = self.config.speed_weight
            state.speed = sample if not state.speed else (1 - w) * state.speed + w * sample
        self._finish(peer, idx)
        self.have.add(idx)
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
        overtaken: bool = False,
    ) -> None:
        """The request failed.

        ``bad``: the chunk did not match its hash (or the peer denied holding a
        chunk it announced); ``stalled``: no byte came for too long. Either way
        the peer is dropped for this version, except a seed that stalls: it
        is the learner, busy rather than hostile, and may be the only holder,
        so it rests like a failed peer. ``busy``: the peer had no free upload
        slot; it rests a moment.
        ``declined``: the peer (the seed) wants this chunk fetched from others;
        we ask it for other chunks meanwhile, and for this one again after
        ``seed_retry_s`` if nobody else has sent it. ``overtaken``: another
        peer's copy came first. Otherwise (reset, error) the peer rests longer.
        A stall or an overtaken request counts against the peer's record.
        """
        self._finish(peer, idx)
        if stalled or overtaken:
            self.records.failed(peer)
        state = self.peers.get(peer)
        if state is None:
            return
        if bad or (stalled and peer != self.seed):
            self.drop(peer)
        elif declined or overtaken:
            state.declined[idx] = now + self.config.seed_retry_s
        elif busy:
            backoff = self.config.busy_backoff_s * 2 ** min(state.busy_streak, 10)
            cap = self.config.busy_backoff_max_s if state.delivered else self.config.busy_stranger_max_s
            state.resting_until = now + min(backoff, cap)
            state.busy_streak += 1
        else:
            state.resting_until = now + self.config.failure_backoff_s
