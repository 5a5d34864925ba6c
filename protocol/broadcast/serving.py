"""The serving side of the broadcast: answer manifest and chunk requests.

One ``ChunkServer`` per engine. A chunk stream carries requests one after
another until the requester closes it. Chunks go out through the process's
upload token bucket, ``upload_slots`` at a time with a short queue behind
(``UploadPolicy`` admits, ``UploadQueue`` orders: see ``uploads``); a
requester that stops reading loses its upload after ``stall_s``. The learner
offers only the chunks not yet sent in its current round and declines the others
(``ask_others``). Requesters that pass nothing on (``reciprocity``: an empty
Have, not a neighbour, or banned) are served within the free riders' share,
and only while no other peer's upload runs or waits: their pieces never take
the uplink from a peer that passes chunks on.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import trio
from libp2p.abc import INetStream

from protocol.broadcast import bitfield
from protocol.broadcast.ratelimit import RefusalPace, TokenBucket
from protocol.broadcast.reciprocity import Standing
from protocol.broadcast.settings import BroadcastConfig, Stats
from protocol.broadcast.store import VersionStore
from protocol.broadcast.uploads import UploadPolicy, UploadQueue
from protocol.errors import ProtocolError
from protocol.manifest import manifest_digest
from protocol.messages import UNKNOWN_JOB, ErrorReply
from protocol.rpc import remote_peer
from protocol.wire import chunk
from protocol.wire.chunk import ChunkData, ManifestRequest
from protocol.wire.have import Have

# Refusals after which a peer's next request waits (``RefusalPace``); not
# ``ask_others``: a redirect, answered once per chunk and round, after which
# the requester asks others or gets the chunk when it asks again.
PACED = {UNKNOWN_JOB, chunk.UNKNOWN_VERSION, chunk.UNKNOWN_CHUNK, chunk.BUSY}


class Engine(Protocol):
    """What serving reads of its engine (``protocol.broadcast.engine.BroadcastEngine``,
    which owns the ``ChunkServer``: the engine imports this module, never the other way)."""

    job_id: str
    is_seed: bool
    config: BroadcastConfig
    store: VersionStore
    stats: Stats
    neighbours: dict[str, Have | None]

    @property
    def relayed_peers(self) -> set[str]: ...

    def have_changed(self) -> None: ...

    def banned(self, peer: str) -> bool: ...

    def holding(self, version: int, variant: str) -> VersionStore | None: ...


class ChunkServer:
    def __init__(self, engine: Engine, works: Callable[[str], bool] | None = None):
        """``works``: the seed's view of who works for the job (see
        ``reciprocity.Standing.free_rider``); None: everyone does."""
        self.engine = engine
        self.works = works
        self.bucket = TokenBucket.from_mbit(engine.config.max_upload_mbit)
        self.free_bucket = TokenBucket.from_mbit(engine.config.free_rider_mbit)
        self._queue = UploadQueue(engine.config.slots(engine.config.max_upload_mbit))
        # Set while no upload holds or waits for a slot (free riders hold none).
        self._uplink_idle = trio.Event()
        self._uplink_idle.set()
        self.standing = Standing(engine.config.initial_credit_chunks, engine.config.credit_s)
        self._policies: dict[tuple[int, str], UploadPolicy] = {}  # by version and variant
        self._largest_version = 0  # chunks in the largest version served: a newcomer's first fetch
        # Half an honest downloader's rest after a busy answer, so that it never waits for this.
        backoff = engine.config.scheduler
        self.refusals = RefusalPace(backoff.busy_backoff_s / 2, backoff.busy_backoff_max_s / 2)

    def offered(self, version: int) -> frozenset[int] | None:
        """The chunks of ``version`` the seed offers now (None: no policy yet, all)."""
        policy = self._policies.get((version, ""))
        return policy.offered() if policy is not None else None

    async def serve(self, stream: INetStream) -> None:
        """Answer requests on ``stream`` until the peer ends it; after a
        refusal, its next request waits its turn (``RefusalPace``)."""
        peer = remote_peer(stream)
        while True:
            await self.refusals.wait(peer)
            if (req := await chunk.next_request(stream)) is None:
                return
            if await self.answer(stream, req) in PACED:
                self.refusals.refused(peer)

    async def answer(self, stream: INetStream, req: chunk.Request) -> str:
        """Answer ``req``; what was answered: ``ok`` or an error code."""
        e = self.engine
        if req.job_id != e.job_id:
            return await self._refuse(stream, UNKNOWN_JOB, f"this swarm runs {e.job_id}")
        if isinstance(req, ManifestRequest):
            newest = e.store.newest()
            version = newest.version if req.version < 0 and newest is not None else req.version
            store = e.holding(version, req.variant)
            if store is None:
                return await self._refuse(stream, chunk.UNKNOWN_VERSION, f"no v{req.version}")
            await chunk.send_reply(stream, store.manifests[version])
            return "ok"
        store = e.holding(req.version, req.variant) if e.config.relay or e.is_seed else None
        if store is None or not store.holds(req.version, req.index):
            return await self._refuse(stream, chunk.UNKNOWN_CHUNK, f"no chunk {req.index} of v{req.version}")
        policy = self._policy(store, req.version, req.variant)
        peer = remote_peer(stream)
        offer = policy.offered()
        weak = peer in e.relayed_peers
        idle = self.works is not None and not self.works(peer)
        free = self.standing.free_rider(
            peer,
            trio.current_time(),
            neighbour=e.neighbours.get(peer) is not None,
            banned=e.banned(peer),
            idle_credit=self._largest_version if idle else None,
        )
        verdict = policy.allow(req.index, peer, weak, free, counted=not idle)
        if verdict != "ok":
            return await self._refuse(stream, verdict, "fetch it later or from another peer")
        if policy.offered() is not offer:
            e.have_changed()
        ok = False
        try:
            # Read only once admitted: a refusal costs no disk read.
            data = store.read(req.version, req.index)
            if data is None:  # gone from the disk since
                return await self._refuse(stream, chunk.UNKNOWN_CHUNK, f"no chunk {req.index} of v{req.version}")
            reply = ChunkData(e.job_id, req.version, req.index, data)
            priority = policy.priority(peer, self._shared(store, peer, req.version))
            # A free rider holds no upload slot: throttled by its own bucket,
            # it held one for seconds while honest requests waited for it.
            async with contextlib.nullcontext() if free else self._slot(priority):
                # A requester that stops reading would hold an upload slot
                # for ever: each piece must leave within stall_s.
                with trio.CancelScope() as scope:

                    async def paced(n: int) -> None:
                        if free:
                            await self.free_bucket.take(n)
                            # Waiting for the others is ours, not a stall of the requester's.
                            scope.deadline = math.inf
                            await self._uplink_idle.wait()
                        await self.bucket.take(n)
                        scope.deadline = trio.current_time() + e.config.stall_s

                    await chunk.send_chunk(stream, reply, piece_bytes=e.config.piece_bytes, before_piece=paced)
            if scope.cancelled_caught:
                raise ProtocolError(f"stopped reading chunk {req.index} of v{req.version}")
            ok = True
            e.stats.bytes_up += len(data)
            e.stats.chunks_up += 1
            self.standing.note_sent(peer, trio.current_time(), works=not idle)
            if free:
                e.stats.free_rider_bytes_up += len(data)
        finally:
            offer = policy.offered()
            policy.finished(req.index, ok=ok, weak=weak, free=free, counted=not idle)
            if policy.offered() is not offer:
                e.have_changed()
        return "ok"

    async def _refuse(self, stream: INetStream, code: str, why: str) -> str:
        await chunk.send_reply(stream, ErrorReply(code, why))
        return code

    @contextlib.asynccontextmanager
    async def _slot(self, priority: int) -> AsyncIterator[None]:
        """Hold one of the upload slots, waiting in ``UploadQueue``'s order."""
        ready = trio.Event()
        if self._uplink_idle.is_set():
            self._uplink_idle = trio.Event()
        self._queue.push(priority, ready)
        self._start_ready()
        try:
            await ready.wait()
        except BaseException:
            if ready.is_set():  # started meanwhile: give the slot on
                self._queue.done()
                self._start_ready()
            else:
                self._queue.remove(ready)
            self._note_idle()
            raise
        try:
            yield
        finally:
            self._queue.done()
            self._start_ready()
            self._note_idle()

    def _note_idle(self) -> None:
        if self._queue.active == 0 and not self._queue:
            self._uplink_idle.set()

    def _start_ready(self) -> None:
        for ready in self._queue.pop_ready():
            ready.set()

    def _shared(self, store: VersionStore, peer: str, version: int) -> int:
        """How many of the chunks of ``version`` we hold ``peer`` announces too."""
        m = store.manifests.get(version)
        theirs = self.engine.neighbours.get(peer)
        if m is None or theirs is None or theirs.version != version or theirs.manifest_digest != manifest_digest(m):
            return 0
        ours = bitfield.encode(store.chunks_held(version), len(m.chunk_hashes))
        return bitfield.common(ours, theirs.bitfield)

    def _policy(self, store: VersionStore, version: int, variant: str) -> UploadPolicy:
        e = self.engine
        key = (version, variant)
        if key not in self._policies:
            n = len(store.manifests[version].chunk_hashes)
            self._largest_version = max(self._largest_version, n)
            self._policies[key] = UploadPolicy(
                n,
                e.config.admitted(e.config.max_upload_mbit, seed=e.is_seed),
                e.is_seed,
                max_free_admitted=e.config.free_rider_admitted,
            )
            for old in [k for k in self._policies if e.holding(*k) is None]:
                del self._policies[old]
        return self._policies[key]
