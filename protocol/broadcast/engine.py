"""The broadcast engine: one per process, the learner (seed) and every node alike.

- Serves every chunk it holds on ``/echo-swarm/chunk/1.2.0`` as soon as the
  chunk is on disk (written only after its hash matched the signed manifest),
  within the upload policy and the upload token bucket (``serving``).
- Keeps a have-stream (``/echo-swarm/have/1.1.0``) with each neighbour
  (``have_streams``), found through DHT provider records of the job's swarm
  key (``discovery``).
- Follows the newest version any neighbour announces (``following``) and
  downloads its chunks from neighbours (``downloads``, with ``scheduler``,
  ``requests`` and ``penalties``).
- Runs bases in the process's ``variant`` when it has one (a llama.cpp q8_0
  node: the q8_0 GGUF the learner publishes beside each LoRA base, see
  ``protocol.models.updates``): it follows the variant in place of the base, and
  the seed serves both from ``variants``, a store of its own.

The engine builds those parts around one shared record (``state``) and is
what the process calls: publish, want, wait. ``run`` owns every task;
cancelling it closes every stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.peerinfo import PeerInfo

from protocol.broadcast import bitfield
from protocol.broadcast.discovery import discover_neighbours
from protocol.broadcast.downloads import Downloads
from protocol.broadcast.following import Following
from protocol.broadcast.have_streams import HaveStreams
from protocol.broadcast.requests import ChunkRequests
from protocol.broadcast.serving import ChunkServer
from protocol.broadcast.settings import BroadcastConfig
from protocol.broadcast.state import EngineState
from protocol.broadcast.store import VersionStore
from protocol.manifest import manifest_digest
from protocol.messages import Manifest
from protocol.models import updates
from protocol.net.swarm import Swarm
from protocol.rpc import serve
from protocol.wire import chunk, have
from protocol.wire.have import Have


class BroadcastEngine:
    def __init__(
        self,
        swarm: Swarm,
        store: VersionStore,
        *,
        job_id: str,
        learner_id: str,
        is_seed: bool,
        config: BroadcastConfig = BroadcastConfig(),
        variant: str = "",
        variants: VersionStore | None = None,
        have_listener: Callable[[str, Have], None] | None = None,
        works: Callable[[str], bool] | None = None,
    ):
        """``variant``: the variant format this process runs bases in, if the
        learner publishes one ("" for none); ``variants``: the seed's store of
        the variants it publishes; ``have_listener``: told of every
        neighbour's Have (the learner uses it to time the broadcast);
        ``works``: the seed's, does a peer work for the job (peers that do
        not are served one version's worth, then as free riders)."""
        self.state = s = EngineState(swarm, store, job_id, learner_id, is_seed, config, target=store.newest())
        # What the process and the serving side read (the same objects as the state's).
        self.swarm, self.store, self.config, self.stats = swarm, store, config, s.stats
        self.job_id, self.learner_id, self.is_seed = job_id, learner_id, is_seed
        self.neighbours = s.neighbours
        self.variants = variants
        self.have_listener = have_listener
        self.server = ChunkServer(self, works)
        self.requests = ChunkRequests(
            swarm,
            store,
            job_id,
            stall_s=config.stall_s,
            min_bytes_per_s=config.min_chunk_kib_s * 1024,
            stats=s.stats,
        )
        self.downloads = Downloads(
            s,
            requests=self.requests,
            standing=self.server.standing,
            on_complete=lambda m: self.following.downloaded(m),
        )
        self.following = Following(s, variant=variant, start_download=self.downloads.start)
        self.haves = HaveStreams(
            s,
            my_have=self._my_have,
            on_have=self._on_have,
            on_gone=self._on_gone,
            max_neighbours=config.neighbour_limit(config.max_upload_mbit),
            max_accepted=config.accept_limit(config.max_upload_mbit),
        )
        if s.target is not None and not is_seed:
            self.following.follow(s.target)

    # --- lifecycle ---------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        host = self.swarm.host
        host.set_stream_handler(have.PROTOCOL, self.haves.accept)
        host.set_stream_handler(chunk.PROTOCOL, serve(chunk.PROTOCOL, self.server.serve, math.inf))
        async with trio.open_nursery() as nursery:
            await nursery.start(self.following.run)
            nursery.start_soon(
                discover_neighbours,
                self.swarm,
                self.job_id,
                self.config,
                self.neighbours,
                self.haves.max_neighbours,
                self.haves.connect,
                nursery,
            )
            nursery.start_soon(self.downloads.loop)
            task_status.started()

    # --- what the owner calls ------------------------------------------------------

    async def publish(self, manifest: Manifest, chunks: list[bytes]) -> None:
        """Seed a new version: store it and announce it to every neighbour."""
        self.store.add_manifest(manifest)

        def save_all() -> None:
            for idx, data in enumerate(chunks):
                self.store.save_chunk(manifest, idx, data)

        await trio.to_thread.run_sync(save_all)
        for idx in range(len(chunks)):
            self.store.mark_held(manifest.version, idx)
        self.state.target = manifest
        self.state.poke_local()

    async def publish_variant(self, manifest: Manifest, chunks: list[bytes]) -> None:
        """Seed a variant of a version (before the version itself, so that
        whoever hears of the version finds its variant)."""
        assert self.variants is not None, "the seed keeps variants in a store of their own"
        store = self.variants
        store.add_manifest(manifest)

        def save_all() -> None:
            for idx, data in enumerate(chunks):
                store.save_chunk(manifest, idx, data)

        await trio.to_thread.run_sync(save_all)
        for idx in range(len(chunks)):
            store.mark_held(manifest.version, idx)

    def holding(self, version: int, variant: str) -> VersionStore | None:
        """The store that holds ``version`` as ``variant`` ("": as published)."""
        for store in (self.store, self.variants):
            m = store.manifests.get(version) if store is not None else None
            if m is not None and updates.variant_of(m) == variant:
                return store
        return None

    def want(self, manifest: Manifest) -> None:
        """Download ``manifest``'s version if it is newer than what we follow
        (``Following.want``)."""
        self.following.want(manifest)

    def newest_wanted(self) -> Manifest | None:
        return self.state.newest_wanted()

    @property
    def target(self) -> Manifest | None:
        """The version downloaded (the seed: published) now."""
        return self.state.target

    async def fetch_manifest_to_follow(self, peer: str, version: int = -1) -> Manifest:
        return await self.following.fetch_manifest_to_follow(peer, version)

    def newest_complete(self) -> int:
        """The newest version held in full, its base too if it is an update (-1: none)."""
        return max((v for v in self.store.manifests if self.store.usable(v)), default=-1)

    async def wait_newer(self, held: int, on_progress: Callable[[int, int], None] | None = None) -> int:
        """Wait until a version newer than ``held`` is complete; the newest complete one."""
        while True:
            m = self.state.target
            if on_progress is not None and m is not None:
                on_progress(len(self.store.chunks_held(m.version)), len(self.neighbours))
            newest = self.newest_complete()
            if newest > held:
                return newest
            await self.state.progress.wait()

    async def wait_progress(self) -> None:
        """Return at the next change of what this process holds or follows."""
        await self.state.progress.wait()

    async def connect(self, info: PeerInfo) -> None:
        """Dial ``info`` and open a have-stream, unless one is already open."""
        await self.haves.connect(info)

    # --- what serving reads (serving.Engine) ----------------------------------------

    def have_changed(self) -> None:
        self.state.have_changed()

    @property
    def relayed_peers(self) -> set[str]:
        """Neighbours reached only through a relay."""
        return self.state.relayed

    def banned(self, peer: str) -> bool:
        return self.downloads.banned(peer)

    # --- have-streams --------------------------------------------------------------

    def _my_have(self) -> Have:
        m = self.state.target
        if m is None:
            return Have(self.job_id, -1, b"", b"")
        held = self.store.chunks_held(m.version) if self.config.relay or self.is_seed else ()
        if self.is_seed:
            # The seed announces what it offers: the chunks not yet sent in
            # this round (uploads.UploadPolicy), so requesters ask it for what
            # the swarm lacks.
            offered = self.server.offered(m.version)
            held = held if offered is None else offered
        base = None if updates.standalone(m) else self.store.base_of(m.version)
        base_digest = manifest_digest(base) if base is not None and self.store.complete(base.version) else b""
        return Have(self.job_id, m.version, manifest_digest(m), bitfield.encode(held, len(m.chunk_hashes)), base_digest)

    def _on_have(self, peer: str, theirs: Have) -> None:
        self.server.standing.note_have(peer, theirs, trio.current_time())
        if self.have_listener is not None:
            self.have_listener(peer, theirs)
        newest = self.state.newest_wanted()
        if newest is None or theirs.version > newest.version:
            self.following.learn(peer, theirs.version)
        self.downloads.apply_have(peer, theirs)

    async def _on_gone(self, peer: str) -> None:
        self.server.standing.forget(peer, trio.current_time())
        await self.downloads.forget(peer)
