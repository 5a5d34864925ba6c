"""What a broadcast engine is told (``BroadcastConfig``) and what it counts (``Stats``).

Apart from the engine (``protocol.broadcast.engine``) so that its parts
(``serving``) and the simulator can name them without importing it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from protocol.broadcast.scheduler import SchedulerConfig


@dataclass(frozen=True)
class BroadcastConfig:
    max_upload_mbit: float = 0.0  # 0: uncapped
    # Two uploads at a time and four queued: a chunk crosses a hop in about
    # two chunk-times and the queue hides round trips. Long queues make
    # requesters wait behind busy peers while others idle; very short ones
    # starve CPU-bound hosts (docs/broadcast.md has the measurements).
    upload_slots: int = 2
    upload_queue: int = 4
    max_peers: int = 16
    # A fast uplink serves more at once and keeps more neighbours: one upload
    # slot per slot_mbit of capped upload (at least upload_slots, the queue
    # growing alike), and max_peers per peers_mbit (up to max_peers_limit).
    # Each chunk's rate is also held back by its requester's downlink, so a
    # 200 Mbit/s uplink with two slots idled at ~20 % in the simulator, with
    # 16 neighbours it had too few requesters to serve.
    slot_mbit: float = 10.0
    peers_mbit: float = 20.0
    max_peers_limit: int = 128
    # A process dials peers until it has neighbour_limit of them, but accepts
    # peers that dial it up to accept_factor times that: with one limit for
    # both, the first nodes filled up with each other, fast nodes that came
    # later found no room, and the nodes with the weakest neighbourhoods
    # finished 25 % after the median (simulator, 300 and 1,000 nodes).
    accept_factor: float = 2.0
    # Once a chunk's bytes flow, a gap this long means the peer stalled and
    # the request is reissued elsewhere (below yamux's 5 s reset). Before the
    # first byte (queued at the uploader) the wait follows the measured
    # request times (SchedulerConfig.timeout_*).
    stall_s: float = 3.0
    # And once they flow, the bytes must keep this pace (after stall_s of
    # grace), or the request is cut as stalled: a peer that sends a byte just
    # inside every stall_s (after a good chunk, so that an overtaken request
    # of it is no stall) held honest nodes at 0.21 of their throughput (issue
    # 55). 8 KiB/s is an eighth of what a 1 Mbit/s uplink's two upload slots
    # carry each.
    min_chunk_kib_s: float = 8.0
    # Neighbour discovery runs this often, backing off (doubling) to
    # discover_max_interval_s while it finds nobody new.
    discover_interval_s: float = 2.0
    discover_max_interval_s: float = 30.0
    # Least time between two Have messages to one neighbour: each frame costs
    # CPU on both sides; 50 ms adds little to a chunk's 100+ ms hop.
    have_interval_s: float = 0.05
    request_timeout_s: float = 10.0
    # Stalls (within ban_s) after which a peer is asked for nothing for
    # ban_s, whether or not it has served us before (penalties.py says why).
    stalls_to_ban: int = 2
    ban_s: float = 600.0
    # Upload write size: larger writes cost py-libp2p far less CPU per byte
    # (~22 MB/s at 32 KiB, see docs/broadcast.md), while 256 KiB still paces
    # a capped uplink in 25 ms steps at 80 Mbit/s.
    piece_bytes: int = 256 * 1024
    # Largest version this process will store (0: any). A node sets it from
    # its disk quota, so that a manifest of thousands of chunks (signed by a
    # hostile learner, or a mistake) is refused before anything is written.
    max_version_bytes: int = 0
    # Reciprocity (protocol.broadcast.reciprocity): a requester that neither
    # named a chunk in its Have nor sent us one within credit_s is a free
    # rider once it has had initial_credit_chunks (a newcomer holds nothing
    # yet: BitTorrent's optimistic unchoke). Free riders together hold
    # free_rider_admitted uploads (one requester's worth: the requests per
    # peer of SchedulerConfig) and one upload start per round of the others.
    initial_credit_chunks: int = 2
    credit_s: float = 600.0
    free_rider_admitted: int = 2
    # Free riders together upload at most this fast (0: only the process's
    # cap), even when nobody else waits: leechers pulling every version from
    # an idle uplink cost its CPU and line for nothing (bench/attacks.py
    # empty_have_leech pulled 8.7 MB/s from 3 nodes and the learner without it).
    free_rider_mbit: float = 4.0
    # False: take chunks but never announce or serve them (the "star"
    # baseline of bench/broadcast.py, where only the seed uploads).
    relay: bool = True
    scheduler: SchedulerConfig = SchedulerConfig()

    def slots(self, upload_mbit: float) -> int:
        """Concurrent uploads for an uplink of ``upload_mbit`` (0: unknown)."""
        return max(self.upload_slots, round(upload_mbit / self.slot_mbit))

    def admitted(self, upload_mbit: float, *, seed: bool = False) -> int:
        """Uploads admitted at once (running and queued). The seed admits
        every request its neighbours may have open, since a ``busy`` answer
        makes a requester rest: it would then get fewer fresh chunks to relay."""
        if seed:
            return self.accept_limit(upload_mbit) * self.scheduler.max_in_flight_per_peer
        slots = self.slots(upload_mbit)
        return slots + self.upload_queue * slots // self.upload_slots

    def neighbour_limit(self, upload_mbit: float) -> int:
        """Neighbours to dial for an uplink of ``upload_mbit`` (0: unknown)."""
        scaled = round(self.max_peers * upload_mbit / self.peers_mbit)
        return max(self.max_peers, min(self.max_peers_limit, scaled))

    def accept_limit(self, upload_mbit: float) -> int:
        """Most neighbours, counting those that dialled us."""
        return round(self.accept_factor * self.neighbour_limit(upload_mbit))


@dataclass
class Stats:
    bytes_from: Counter = field(default_factory=Counter)
    chunks_from: Counter = field(default_factory=Counter)
    bytes_up: int = 0
    free_rider_bytes_up: int = 0  # of bytes_up, sent to free riders (protocol.broadcast.reciprocity)
    chunks_up: int = 0
    banned: list[tuple[str, int]] = field(default_factory=list)  # (peer, version): hash mismatches
    stalls: Counter = field(default_factory=Counter)
    peer_bans: Counter = field(default_factory=Counter)  # peer -> times banned from downloads
    completed_at: dict[int, float] = field(default_factory=dict)
