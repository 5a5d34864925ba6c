"""The broadcast engine: one per process, the learner (seed) and every node alike.

- Serves every chunk it holds on ``/echo-swarm/chunk/1.2.0`` as soon as the
  chunk is on disk (written only after its hash matched the signed manifest),
  within the upload policy and the upload token bucket.
- Keeps a have-stream (``/echo-swarm/have/1.1.0``) with each neighbour: both
  sides send a ``Have`` (version, manifest digest, bitfield, base held) whenever theirs
  changes, and read the other's continuously (yamux resets a stream whose
  reader stalls for 5 s).
- Follows the newest version any neighbour announces: fetches its manifest
  (checked against the learner's key), then downloads its chunks from
  neighbours as ``scheduler.Download`` decides. A request that makes no
  progress for ``stall_s`` (or brings no byte in a few typical request
  times, ``Download.request_timeout``) is
  cancelled and reissued elsewhere, and its peer dropped for that version and
  struck (the learner only rests: it is busy, not hostile); ``stalls_to_ban``
  strikes, a chunk that fails its hash, or a denied chunk the peer announces,
  ban the peer from our downloads for ``ban_s``. A request overtaken by
  another holder's endgame copy is no stall; one to a peer that has never
  sent us a good chunk, with no byte yet, runs on to find out whether it
  answers (``ChunkRequests.request``).
- Finds neighbours through DHT provider records of the job's swarm key.
- Runs bases in the process's ``variant`` when it has one (a llama.cpp q8_0
  node: the q8_0 GGUF the learner publishes beside each LoRA base, see
  ``protocol.models.updates``): it follows the variant in place of the base, and
  the seed serves both from ``variants``, a store of its own.

The parts live beside it: ``scheduler`` (which chunk to ask of whom),
``requests`` (one chunk request and its streams), ``penalties`` (strikes and
bans), ``discovery`` (finding neighbours), ``serving`` and ``uploads`` (the
other side of a request), ``store`` (chunks on disk).

``run`` owns every task; cancelling it closes every stream.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.host.exceptions import HostException
from libp2p.network.exceptions import SwarmException
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from protocol import manifest as manifests
from protocol.broadcast import bitfield
from protocol.broadcast import requests as outcomes
from protocol.broadcast.discovery import discover_neighbours
from protocol.broadcast.penalties import Penalties
from protocol.broadcast.requests import ChunkRequests, discard
from protocol.broadcast.scheduler import Download
from protocol.broadcast.serving import ChunkServer
from protocol.broadcast.settings import BroadcastConfig, Stats
from protocol.broadcast.store import VersionStore
from protocol.errors import ProtocolError
from protocol.manifest import manifest_digest
from protocol.messages import ErrorReply, Manifest
from protocol.models import updates
from protocol.net.dial import DialFailed, is_relayed
from protocol.net.swarm import Swarm, reach
from protocol.process.logs import event
from protocol.rpc import RequestFailed, remote_peer, request, route, serve
from protocol.wire import chunk, have
from protocol.wire.chunk import ManifestRequest
from protocol.wire.have import Have

log = logging.getLogger(__name__)

# Peers remembered as having served us a good chunk (then forgotten at once).
MAX_TRUSTED = 4096
# Versions remembered as having no variant (asked once each).
MAX_WITHOUT_VARIANT = 1024

# Errors a request to a peer can end with when the peer misbehaves or vanishes
# mid-dial (py-libp2p's errors share no base class below Exception); none may
# stop the engine. Anything else is a bug.
PEER_ERRORS = (ProtocolError, StreamError, SwarmException, HostException, RequestFailed, OSError)


class VersionTooLarge(RequestFailed):
    """A signed manifest asks for more disk than ``max_version_bytes`` allows."""


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
    ):
        """``variant``: the variant format this process runs bases in, if the
        learner publishes one ("" for none); ``variants``: the seed's store of
        the variants it publishes."""
        self.swarm = swarm
        self.store = store
        self.variant = variant
        self.variants = variants
        self._without_variant: set[int] = set()
        self.job_id = job_id
        self.learner_id = learner_id
        self.is_seed = is_seed
        self.config = config
        self.me = swarm.host.get_id().to_base58()
        self.max_neighbours = config.neighbour_limit(config.max_upload_mbit)
        self.max_accepted = config.accept_limit(config.max_upload_mbit)
        self.stats = Stats()
        self.neighbours: dict[str, Have | None] = {}  # peer -> its latest Have
        self.download: Download | None = None
        self._queued: Manifest | None = None  # the newest version, once the current one is done
        self.target: Manifest | None = store.newest()
        self.server = ChunkServer(self)
        self.requests = ChunkRequests(
            swarm,
            store,
            job_id,
            stall_s=config.stall_s,
            min_bytes_per_s=config.min_chunk_kib_s * 1024,
            stats=self.stats,
        )
        self.penalties = Penalties(config, self.stats, on_ban=self._on_ban)
        self._learning: set[int] = set()
        self._relayed: set[str] = set()  # neighbours reached only through a relay
        # Peers that have sent us a good chunk: asked first, and given a second
        # chance after a stall.
        self._trusted: set[str] = set()
        self._local_changed = trio.Event()
        self._wake_downloader = trio.Event()
        self._progress = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._rng = random.Random()
        # Told of every neighbour's Have (the learner uses it to time the broadcast).
        self.have_listener: Callable[[str, Have], None] | None = None
        if self.target is not None and not self.is_seed:
            self._follow(self.target)

    # --- lifecycle ---------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        host = self.swarm.host
        host.set_stream_handler(have.PROTOCOL, self._on_have_stream)
        host.set_stream_handler(chunk.PROTOCOL, serve(chunk.PROTOCOL, self.server.serve, math.inf))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(
                discover_neighbours,
                self.swarm,
                self.job_id,
                self.config,
                self.neighbours,
                self.max_neighbours,
                self.connect,
                nursery,
            )
            nursery.start_soon(self._download_loop)
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
        self.target = manifest
        self._poke_local()

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
        """Download ``manifest``'s version if it is newer than what we follow.

        A download at least half done is finished first and the newest version
        queued behind it: when versions come faster than one broadcast takes
        (async training), switching at every announcement would never complete
        any, while a finished older version is still inside the learner's
        staleness window.
        """
        newest = self.newest_wanted()
        if newest is not None and manifest.version < newest.version:
            return
        if newest is not None and manifest.version == newest.version:
            if manifest_digest(manifest) == manifest_digest(newest):
                return
        held = self.store.manifests.get(manifest.version)
        if held is not None and manifest_digest(held) != manifest_digest(manifest):
            return  # the version is held in another form (e.g. its variant): keep that
        self.store.add_manifest(manifest)
        if self._finishing_first():
            self._queued = manifest
            self._poke_local()
            return
        self._follow(manifest)

    def _follow(self, m: Manifest) -> None:
        """Download ``m``'s version, or first its base if it is an update
        against a base not held in full (``m`` waits queued meanwhile)."""
        if updates.standalone(m) or self.store.complete(m.base_version) and self.store.base_of(m.version):
            self._start_download(m)
            return
        self._queued = m
        base = self.store.base_of(m.version)
        if base is not None:
            self._start_download(base)
        elif self._nursery is not None and m.base_version not in self._learning:
            self._learning.add(m.base_version)
            self._nursery.start_soon(self._fetch_base, m)

    async def _fetch_base(self, update: Manifest) -> None:
        """Get the manifest of ``update``'s base (in our variant if there is
        one), from the learner or else a neighbour."""
        try:
            for peer in [self.learner_id, *(p for p in self.neighbours if p != self.learner_id)]:
                try:
                    base = await self.fetch_manifest_to_follow(peer, update.base_version)
                except PEER_ERRORS as exc:
                    event(
                        log,
                        logging.INFO,
                        "could not get a base manifest",
                        peer=peer,
                        version=update.base_version,
                        error=exc,
                    )
                    continue
                try:
                    updates.check_base(update, base)
                except updates.UpdateRefused as exc:
                    # Signed by the learner, yet not this update's base: a
                    # restarted run reusing numbers, or a learner bug.
                    event(
                        log,
                        logging.WARNING,
                        "refusing an update against another base",
                        version=update.version,
                        error=exc,
                    )
                    if self._queued is update:
                        self._queued = None
                    return
                self.store.add_manifest(base)
                if self._queued is update:
                    self._start_download(base)
                return
        finally:
            self._learning.discard(update.base_version)

    def newest_wanted(self) -> Manifest | None:
        return self._queued if self._queued is not None else self.target

    def _finishing_first(self) -> bool:
        m = self.target
        if m is None or self.is_seed or self.download is None:
            return False
        held, n = len(self.store.chunks_held(m.version)), len(m.chunk_hashes)
        return held < n and 2 * held >= n

    def newest_complete(self) -> int:
        """The newest version held in full, its base too if it is an update (-1: none)."""
        return max((v for v in self.store.manifests if self.store.usable(v)), default=-1)

    async def wait_newer(self, held: int, on_progress: Callable[[int, int], None] | None = None) -> int:
        """Wait until a version newer than ``held`` is complete; the newest complete one."""
        while True:
            m = self.target
            if on_progress is not None and m is not None:
                on_progress(len(self.store.chunks_held(m.version)), len(self.neighbours))
            newest = self.newest_complete()
            if newest > held:
                return newest
            await self._progress.wait()

    async def wait_progress(self) -> None:
        """Return at the next change of what this process holds or follows."""
        await self._progress.wait()

    async def connect(self, info: PeerInfo) -> None:
        """Dial ``info`` and open a have-stream, unless one is already open."""
        peer = info.peer_id.to_base58()
        if peer == self.me or peer in self.neighbours:
            return
        if len(self.neighbours) >= self.max_neighbours or self._waits_to_be_dialled(info):
            return
        self.neighbours[peer] = None  # reserve: no second dial while this one runs
        event(log, logging.DEBUG, "dialling peer", peer=peer, addrs=[str(a) for a in info.addrs])
        try:
            with trio.fail_after(self.config.request_timeout_s):
                if info.addrs:
                    how = await reach(self.swarm, info, self.config.request_timeout_s)
                    event(log, logging.DEBUG, "connected to peer", peer=peer, route=how)
                stream = await self.swarm.host.new_stream(info.peer_id, [have.PROTOCOL])
        except (trio.TooSlowError, DialFailed, *PEER_ERRORS) as exc:
            self.neighbours.pop(peer, None)
            event(log, logging.DEBUG, "could not reach peer", peer=peer, error=exc)
            return
        await self._run_have_stream(peer, stream)

    def _waits_to_be_dialled(self, info: PeerInfo) -> bool:
        """Two peers behind NAT that dial each other at once through the relay
        start two hole punches that collide (each side's SYN leaves from the
        same port); so between two such peers, only the smaller id dials."""
        both_natted = (
            any(is_relayed(a) for a in info.addrs)
            and self.swarm.relay is not None
            and bool(self.swarm.relay.advertised)
        )
        return both_natted and self.me > info.peer_id.to_base58()

    # --- notifications -------------------------------------------------------------

    def have_changed(self) -> None:
        """What we announce changed (chunks held, or the seed's offer): have-writers send."""
        self._local_changed.set()
        self._local_changed = trio.Event()

    @property
    def relayed_peers(self) -> set[str]:
        """Neighbours reached only through a relay."""
        return self._relayed

    def _poke_local(self) -> None:
        """Our holdings changed: have-writers send, waiters re-check."""
        self.have_changed()
        self._progress.set()
        self._progress = trio.Event()
        self._poke_downloader()

    def _poke_downloader(self) -> None:
        self._wake_downloader.set()
        self._wake_downloader = trio.Event()

    # --- have-streams --------------------------------------------------------------

    def _my_have(self) -> Have:
        m = self.target
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

    async def _on_have_stream(self, stream: INetStream) -> None:
        peer = remote_peer(stream)
        if peer in self.neighbours or len(self.neighbours) >= self.max_accepted:
            await stream.close()
            return
        self.neighbours[peer] = None
        await self._run_have_stream(peer, stream)

    async def _run_have_stream(self, peer: str, stream: INetStream) -> None:
        if route(stream.muxed_conn) != "direct":
            self._relayed.add(peer)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._have_writer, stream)
                await self._have_reader(peer, stream)
                nursery.cancel_scope.cancel()
        except* PEER_ERRORS as group:
            event(log, logging.DEBUG, "have-stream ended", peer=peer, error=group.exceptions[0])
        finally:
            self.neighbours.pop(peer, None)
            self.server.standing.forget(peer, trio.current_time())
            self._relayed.discard(peer)
            await self.requests.forget(peer)
            if self.download is not None:
                self.download.remove_peer(peer)
            self._poke_downloader()
            await discard(stream)

    async def _have_writer(self, stream: INetStream) -> None:
        last = None
        while True:
            changed = self._local_changed
            mine = self._my_have()
            if mine != last:
                await have.send(stream, mine)
                last = mine
                # Coalesce: chunks that arrive meanwhile go out in one Have.
                await trio.sleep(self.config.have_interval_s)
                continue
            await changed.wait()

    async def _have_reader(self, peer: str, stream: INetStream) -> None:
        while True:
            theirs = await have.receive(stream)
            if theirs.job_id != self.job_id:
                raise ProtocolError(f"have for job {theirs.job_id}")
            self.neighbours[peer] = theirs
            self.server.standing.note_have(peer, theirs, trio.current_time())
            if self.have_listener is not None:
                self.have_listener(peer, theirs)
            newest = self.newest_wanted()
            if newest is None or theirs.version > newest.version:
                self._learn_version(peer, theirs.version)
            self._apply_have(peer, theirs)

    def _apply_have(self, peer: str, latest: Have) -> None:
        m, d = self.target, self.download
        if m is None or d is None:
            return
        if latest.version != m.version or m.format in updates.VARIANTS and peer == self.learner_id:
            if self._holds_as_base(peer, latest, m) and not self.banned(peer):
                # Following an update against m means holding m in full.
                d.update_peer(peer, frozenset(range(len(m.chunk_hashes))))
                self._poke_downloader()
            return
        if self.banned(peer):
            d.drop(peer)
            return
        if latest.manifest_digest != manifest_digest(m):
            return  # same number, other weights (e.g. a restarted run): not ours
        try:
            d.update_peer(peer, bitfield.decode(latest.bitfield, len(m.chunk_hashes)))
        except ProtocolError as exc:
            event(log, logging.INFO, "bad have", peer=peer, error=exc)
            return
        self._poke_downloader()

    def _learn_version(self, peer: str, version: int) -> None:
        if version in self._learning or self._nursery is None:
            return
        self._learning.add(version)
        self._nursery.start_soon(self._fetch_manifest, peer, version)

    async def fetch_manifest(self, peer: str, version: int = -1, variant: str = "") -> Manifest:
        """Manifest ``version`` (-1: the newest; ``variant``: of that variant)
        from ``peer``, checked against the job and the learner's key;
        ``RequestFailed`` otherwise."""
        ask = ManifestRequest(self.job_id, version, variant)
        reply = await request(
            self.swarm.host,
            ID.from_base58(peer),
            chunk.PROTOCOL,
            lambda stream: chunk.ask_manifest(stream, ask),
            timeout_s=self.config.request_timeout_s,
        )
        if isinstance(reply, ErrorReply):
            raise RequestFailed(f"{peer} has no manifest v{version}: {reply.code}")
        if reply.job_id != self.job_id or version >= 0 and reply.version != version:
            raise RequestFailed(f"{peer} sent the manifest of v{reply.version} of job {reply.job_id}")
        if updates.variant_of(reply) != variant:
            raise RequestFailed(f"{peer} sent a {reply.format} manifest, not a {variant or 'published'} one")
        try:
            manifests.check(reply, self.learner_id)
        except ProtocolError as exc:
            raise RequestFailed(f"{peer} sent a manifest that fails its check: {exc}") from exc
        if self.config.max_version_bytes and reply.total_size > self.config.max_version_bytes:
            raise VersionTooLarge(
                f"version {reply.version} is {reply.total_size / 2**30:.2f} GiB, more than this "
                f"process may store per version ({self.config.max_version_bytes / 2**30:.2f} GiB)"
            )
        return reply

    async def fetch_manifest_to_follow(self, peer: str, version: int = -1) -> Manifest:
        """The manifest of ``version`` (-1: the newest ``peer`` holds) to
        follow: its variant, where this process runs bases in one and the
        version has it (asked of ``peer``, then of the learner), else itself."""
        m = await self.fetch_manifest(peer, version)
        if not self.variant or m.format != updates.FULL or m.version in self._without_variant:
            return m
        for source in dict.fromkeys((peer, self.learner_id)):
            try:
                variant = await self.fetch_manifest(source, m.version, self.variant)
            except PEER_ERRORS as exc:
                event(log, logging.DEBUG, "no variant here", peer=source, version=m.version, error=exc)
                continue
            if variant.base_digest == manifest_digest(m):
                return variant
        if len(self._without_variant) >= MAX_WITHOUT_VARIANT:
            self._without_variant.clear()
        self._without_variant.add(m.version)
        return m

    async def _fetch_manifest(self, peer: str, version: int) -> None:
        try:
            self.want(await self.fetch_manifest_to_follow(peer, version))
        except PEER_ERRORS as exc:
            event(log, logging.INFO, "could not get manifest", peer=peer, version=version, error=exc)
        finally:
            self._learning.discard(version)

    # --- downloading ---------------------------------------------------------------

    def _start_download(self, m: Manifest) -> None:
        self.target = m
        if self._queued is not None and self._queued.version <= m.version:
            self._queued = None
        self.download = Download(
            n_chunks=len(m.chunk_hashes),
            have=set(self.store.chunks_held(m.version)),
            seed=self.learner_id,
            config=self.config.scheduler,
            rng=self._rng,
            relayed=self._relayed,
            trusted=self._trusted,
            rested=self.download.busy_strangers() if self.download is not None else {},
        )
        for peer, latest in self.neighbours.items():
            if latest is not None:
                self._apply_have(peer, latest)
        self._poke_local()

    async def _download_loop(self) -> None:
        assert self._nursery is not None
        while True:
            wake = self._wake_downloader
            d, m = self.download, self.target
            deadline = float("inf")
            if d is not None and m is not None and not d.complete:
                now = trio.current_time()
                for peer, idx in d.next_requests(now):
                    self._nursery.start_soon(self._fetch_chunk, d, m, peer, idx)
                deadline = d.next_wakeup(now)
                self.requests.retime(d)
            with trio.move_on_at(deadline):
                await wake.wait()

    async def _fetch_chunk(self, d: Download, m: Manifest, peer: str, idx: int) -> None:
        outcome = outcomes.FAILED
        try:
            outcome = await self.requests.request(
                m,
                peer,
                idx,
                d.request_timeout(peer),
                guessed=self.download is None or not self.download.durations,
                is_neighbour=self.neighbours.__contains__,
                announces=self._announces,
                trusted=self._trusted.__contains__,
            )
        except PEER_ERRORS as exc:
            event(log, logging.DEBUG, "chunk request failed", peer=peer, idx=idx, error=exc)
        now = trio.current_time()
        event(log, logging.DEBUG, "chunk request ended", peer=peer[-6:], idx=idx, outcome=outcome)
        if outcome == outcomes.OK:
            d.on_done(peer, idx, now)
            if len(self._trusted) >= MAX_TRUSTED:
                self._trusted.clear()
            self._trusted.add(peer)
            self.server.standing.note_served_us(peer, now)
            self.requests.cancel_copies(idx, done_by=peer)
            if self.store.complete(m.version):
                self.stats.completed_at.setdefault(m.version, time.time())
                queued, self._queued = self._queued, None
                if queued is not None and queued.version > m.version:
                    self._follow(queued)
            self._poke_local()
        else:
            if outcome == outcomes.BAD:
                self.stats.banned.append((peer, m.version))
                self.penalties.ban(peer, "sent a chunk that failed its hash", version=m.version, chunk=idx)
            elif outcome == outcomes.DENIED:
                self.penalties.ban(peer, "denied a chunk it announces", version=m.version, chunk=idx)
            elif outcome == outcomes.STALLED and not self.banned(peer) and peer != self.learner_id:
                self.penalties.strike(peer, self._trusted)
            d.on_failed(
                peer,
                idx,
                now,
                bad=outcome in (outcomes.BAD, outcomes.DENIED),
                stalled=outcome == outcomes.STALLED,
                busy=outcome == chunk.BUSY,
                declined=outcome in (chunk.ASK_OTHERS, outcomes.OVERTAKEN),
            )
            self._poke_downloader()

    # --- peers that waste our time -------------------------------------------------

    def banned(self, peer: str) -> bool:
        return self.penalties.banned(peer)

    def _on_ban(self, peer: str) -> None:
        if self.download is not None:
            self.download.drop(peer)

    def _holds_as_base(self, peer: str, latest: Have, m: Manifest) -> bool:
        """Does ``peer`` hold ``m`` in full, following a newer version? Its Have
        names the base it holds (engines fetch an update only once they hold
        its base in full); the learner holds the variants it published."""
        if m.format in updates.VARIANTS and peer == self.learner_id:
            return latest.version >= m.version
        return latest.version > m.version and latest.base_digest == manifest_digest(m)

    def _announces(self, peer: str, m: Manifest, idx: int) -> bool:
        """Does ``peer``'s latest Have still name chunk ``idx`` of ``m``?"""
        latest = self.neighbours.get(peer)
        if latest is None or latest.version != m.version or latest.manifest_digest != manifest_digest(m):
            return False
        byte = idx // 8
        return len(latest.bitfield) > byte and bool(latest.bitfield[byte] >> (idx % 8) & 1)
