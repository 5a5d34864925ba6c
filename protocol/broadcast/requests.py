"""Chunk requests to neighbours: one request, its timeout, and the streams it reuses.

Idle chunk streams are kept per peer and reused request after request: a
fresh py-libp2p yamux stream starts with a 256 KiB window and polls every
10 ms once it is spent; a reused one has grown its window.

A request waits ``timeout_s`` for its first byte, then ``stall_s`` between
bytes, and from its first byte on the chunk must come at ``min_bytes_per_s``
on average (a peer that trickles a byte just inside every ``stall_s`` would
otherwise hold a request for ever); while no request time is measured yet the
timeout is a first guess, which ``retime`` replaces once one is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from protocol.broadcast.scheduler import Download
from protocol.broadcast.settings import Stats
from protocol.broadcast.store import VersionStore
from protocol.errors import ChunkHashMismatch
from protocol.messages import ErrorReply, Manifest
from protocol.models import updates
from protocol.net.swarm import Swarm
from protocol.process.logs import event
from protocol.wire import chunk
from protocol.wire.chunk import ChunkRequest

log = logging.getLogger(__name__)

# What a request can end with (besides raising one of the engine's PEER_ERRORS).
OK = "ok"
BAD = "bad"  # the chunk failed its hash, or is not the one asked for
DENIED = "denied"  # refused a chunk the peer announces
STALLED = "stalled"  # no byte within the timeout, or none for stall_s once they flowed
OVERTAKEN = "overtaken"  # another peer's copy came first (see ``request``)
FAILED = "failed"
# and the server's own codes: chunk.BUSY, chunk.ASK_OTHERS


@dataclass
class _OpenRequest:
    scope: trio.CancelScope
    started: float
    guessed: bool  # its timeout is the first guess, made before any request time was measured
    trusted: bool  # the peer vouches for itself (see ``request``): an overtaken request of it ends at once
    received: int = 0  # bytes so far
    first_byte_at: float | None = None
    overtaken: bool = False  # cancelled because another peer's copy of the chunk came first

    def deadline_after(self, n: int, now: float, stall_s: float, min_bytes_per_s: float) -> float:
        """``n`` more bytes came at ``now``: the request's new deadline. Once
        bytes flow, each must be followed within ``stall_s``, and the bytes so
        far must keep ``min_bytes_per_s`` after ``stall_s`` of grace: cut the
        moment they fall behind that pace, not when the whole chunk would be
        due at it (a trickler sending a byte every 2 s held a 1 MiB request
        for 131 s that way)."""
        if self.first_byte_at is None:
            self.first_byte_at = now
        self.received += n
        return min(now + stall_s, self.first_byte_at + stall_s + self.received / min_bytes_per_s)


class ChunkRequests:
    def __init__(
        self, swarm: Swarm, store: VersionStore, job_id: str, *, stall_s: float, min_bytes_per_s: float, stats: Stats
    ):
        self.swarm = swarm
        self.store = store
        self.job_id = job_id
        self.stall_s = stall_s
        self.min_bytes_per_s = min_bytes_per_s
        self.stats = stats
        self._lanes: dict[str, list[INetStream]] = {}  # idle chunk streams per peer
        self._open: dict[tuple[str, int], _OpenRequest] = {}  # requests under way

    async def request(
        self,
        m: Manifest,
        peer: str,
        idx: int,
        timeout_s: float,
        *,
        guessed: bool,
        is_neighbour: Callable[[str], bool],
        announces: Callable[[str, Manifest, int], bool],
        trusted: Callable[[str], bool],
    ) -> str:
        """Ask ``peer`` for chunk ``idx`` of ``m`` and store it; the outcome.
        ``guessed``: ``timeout_s`` is a first guess. Asked once the reply is in:
        ``is_neighbour(peer)`` (only then is its stream kept for reuse) and
        ``announces(peer, m, idx)`` (its latest Have names the chunk, so
        refusing it is a lie).

        Once bytes flow they must keep ``min_bytes_per_s`` after ``stall_s``
        of grace, or the request ends ``STALLED`` there and then.

        When another peer's copy comes first (``cancel_copies``), a request
        to a peer that vouches for itself (``trusted(peer)``: it has sent us
        good chunks, and more of them than requests to it failed) ends
        ``OVERTAKEN``: the peer was only slower this once. Counting that as a
        stall had honest nodes on one busy machine ban each other within a
        minute (bench/attacks.py baselines). Any other peer's request runs on
        to its answer, its timeout or its pace: that tells an honest peer
        (now trusted) from one that never sends or trickles (``STALLED``)."""
        lanes = self._lanes.setdefault(peer, [])
        stream = lanes.pop() if lanes else None
        reusable = False
        started = trio.current_time()
        with trio.CancelScope(deadline=started + timeout_s) as scope:
            open_request = self._open[(peer, idx)] = _OpenRequest(scope, started, guessed, trusted(peer))

            def progress(n: int) -> None:
                scope.deadline = open_request.deadline_after(n, trio.current_time(), self.stall_s, self.min_bytes_per_s)

            try:
                if stream is None:
                    stream = await self.swarm.host.new_stream(ID.from_base58(peer), [chunk.PROTOCOL])
                ask = ChunkRequest(self.job_id, m.version, idx, updates.variant_of(m))
                reply = await chunk.ask_chunk(stream, ask, progress)
                reusable = True
            finally:
                self._open.pop((peer, idx), None)
                if reusable and is_neighbour(peer):
                    self._lanes.setdefault(peer, []).append(stream)
                elif stream is not None:
                    await discard(stream)
        if scope.cancelled_caught:
            if open_request.overtaken:
                return OVERTAKEN
            self.stats.stalls[peer] += 1
            event(log, logging.INFO, "peer stalled; reissuing", peer=peer, chunk=idx)
            return STALLED
        if isinstance(reply, ErrorReply):
            if reply.code == chunk.UNKNOWN_CHUNK and announces(peer, m, idx):
                return DENIED
            return reply.code if reply.code in (chunk.BUSY, chunk.ASK_OTHERS) else FAILED
        if (reply.job_id, reply.version, reply.index) != (self.job_id, m.version, idx):
            return BAD
        try:
            # Hashing and writing 1 MiB take milliseconds: off the event loop.
            await trio.to_thread.run_sync(self.store.save_chunk, m, idx, reply.data)
        except ChunkHashMismatch:
            return BAD
        if not self.store.mark_held(m.version, idx):
            return FAILED  # dropped meanwhile (older than the newest K)
        self.stats.bytes_from[peer] += len(reply.data)
        self.stats.chunks_from[peer] += 1
        return OK

    def retime(self, d: Download) -> None:
        """Give requests sent on a first guess a measured timeout, once one is
        measured: a stalling peer asked first need not be waited out."""
        if not d.durations:
            return
        for (peer, _), open_request in self._open.items():
            if open_request.guessed and not open_request.received:
                open_request.scope.deadline = open_request.started + d.request_timeout(peer)
                open_request.guessed = False

    def cancel_copies(self, idx: int, done_by: str) -> None:
        """Chunk ``idx`` came from ``done_by``: end the requests for it to
        others, but those with no byte yet to a peer that does not vouch for
        itself: they run on to their verdict (see ``request``)."""
        for (other, i), open_request in list(self._open.items()):
            if i == idx and other != done_by and (open_request.trusted or open_request.received):
                open_request.overtaken = True
                open_request.scope.cancel()

    async def forget(self, peer: str) -> None:
        """``peer`` is no longer a neighbour: close its idle streams."""
        for lane in self._lanes.pop(peer, []):
            await discard(lane)


async def discard(stream: INetStream) -> None:
    """Reset a stream we will not use again (shielded: runs during cancellation)."""
    with trio.move_on_after(1) as scope:
        scope.shield = True
        try:
            await stream.reset()
        except Exception:
            pass  # already reset by the remote
