"""The broadcast engine: one per process, the learner (seed) and every node alike.

- Serves every chunk it holds on ``/echo-swarm/chunk/1.1.0`` as soon as the
  chunk is on disk (written only after its hash matched the signed manifest),
  within the upload policy and the upload token bucket.
- Keeps a have-stream (``/echo-swarm/have/1.0.0``) with each neighbour: both
  sides send a ``Have`` (version, manifest digest, bitfield) whenever theirs
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
  ban the peer from our downloads for ``ban_s``.
- Finds neighbours through DHT provider records of the job's swarm key.

``run`` owns every task; cancelling it closes every stream.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.host.exceptions import HostException
from libp2p.network.exceptions import SwarmException
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from protocol import manifest as manifests
from protocol import updates
from protocol.broadcast import bitfield
from protocol.broadcast.scheduler import Download
from protocol.broadcast.serving import ChunkServer, manifest_digest
from protocol.broadcast.settings import BroadcastConfig, Stats
from protocol.broadcast.store import VersionStore
from protocol.dial import DialFailed, is_relayed
from protocol.errors import ChunkHashMismatch, ProtocolError
from protocol.ids import swarm_key
from protocol.logs import event
from protocol.messages import ErrorReply, Manifest
from protocol.rpc import RequestFailed, remote_peer, request, route, serve
from protocol.swarm import Swarm, announce, find_providers, reach
from protocol.wire import chunk, have
from protocol.wire.chunk import ChunkRequest, ManifestRequest
from protocol.wire.have import Have

log = logging.getLogger(__name__)

# Peers remembered as having served us a good chunk (then forgotten at once).
MAX_TRUSTED = 4096

# Errors a request to a peer can end with when the peer misbehaves or vanishes
# mid-dial (py-libp2p's errors share no base class below Exception); none may
# stop the engine. Anything else is a bug.
PEER_ERRORS = (ProtocolError, StreamError, SwarmException, HostException, RequestFailed, OSError)


@dataclass
class _OpenRequest:
    scope: trio.CancelScope
    started: float
    guessed: bool  # its timeout is the first guess, made before any request time was measured
    received: int = 0  # bytes so far


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
    ):
        self.swarm = swarm
        self.store = store
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
        # Idle chunk streams per peer, reused request after request: a fresh
        # py-libp2p yamux stream starts with a 256 KiB window and polls every
        # 10 ms once it is spent; a reused one has grown its window.
        self._lanes: dict[str, list[INetStream]] = {}
        self._learning: set[int] = set()
        self._relayed: set[str] = set()  # neighbours reached only through a relay
        self._open: dict[tuple[str, int], _OpenRequest] = {}  # chunk requests under way
        # Peers that have sent us a good chunk: asked first, and given a second
        # chance after a stall.
        self._trusted: set[str] = set()
        self._stall_times: dict[str, list[float]] = {}  # recent stalls per peer
        self._banned_until: dict[str, float] = {}  # peers we ask for nothing (they stalled or lied)
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
            nursery.start_soon(self._discover_loop)
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
        self.store.add_manifest(manifest)
        if self._finishing_first():
            self._queued = manifest
            self._poke_local()
            return
        self._follow(manifest)

    def _follow(self, m: Manifest) -> None:
        """Download ``m``'s version, or first its base if it is an update
        against a base not held in full (``m`` waits queued meanwhile)."""
        if m.base_version < 0 or self.store.complete(m.base_version) and self.store.base_of(m.version):
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
        """Get the manifest of ``update``'s base, from the learner or else a neighbour."""
        try:
            for peer in [self.learner_id, *(p for p in self.neighbours if p != self.learner_id)]:
                try:
                    base = await self.fetch_manifest(peer, update.base_version)
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
        return Have(self.job_id, m.version, manifest_digest(m), bitfield.encode(held, len(m.chunk_hashes)))

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
            self._relayed.discard(peer)
            for lane in self._lanes.pop(peer, []):
                await _discard(lane)
            if self.download is not None:
                self.download.remove_peer(peer)
            self._poke_downloader()
            await _discard(stream)

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
        if latest.version != m.version:
            if self._holds_as_base(latest, m) and not self.banned(peer):
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

    async def fetch_manifest(self, peer: str, version: int = -1) -> Manifest:
        """Manifest ``version`` (-1: the newest) from ``peer``, checked against the
        job and the learner's key; ``RequestFailed`` otherwise."""
        ask = ManifestRequest(self.job_id, version)
        reply = await request(
            self.swarm.host,
            ID.from_base58(peer),
            chunk.PROTOCOL,
            lambda stream: chunk.ask_manifest(stream, ask),
            timeout_s=self.config.request_timeout_s,
        )
        if isinstance(reply, ErrorReply):
            raise RequestFailed(f"{peer} has no manifest v{version}: {reply.code}")
        if reply.job_id != self.job_id:
            raise RequestFailed(f"{peer} sent a manifest of job {reply.job_id}")
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

    async def _fetch_manifest(self, peer: str, version: int) -> None:
        try:
            self.want(await self.fetch_manifest(peer, version))
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
                # A request sent before any request time was measured waits
                # a first guess; once one is measured, it gets a measured
                # timeout (a stalling peer asked first need not be waited out).
                if d.durations:
                    for (peer, _), open_request in self._open.items():
                        if open_request.guessed and not open_request.received:
                            open_request.scope.deadline = open_request.started + d.request_timeout(peer)
                            open_request.guessed = False
            with trio.move_on_at(deadline):
                await wake.wait()

    async def _fetch_chunk(self, d: Download, m: Manifest, peer: str, idx: int) -> None:
        outcome = "failed"
        try:
            outcome = await self._request_chunk(m, peer, idx, d.request_timeout(peer))
        except PEER_ERRORS as exc:
            event(log, logging.DEBUG, "chunk request failed", peer=peer, idx=idx, error=exc)
        now = trio.current_time()
        event(log, logging.DEBUG, "chunk request ended", peer=peer[-6:], idx=idx, outcome=outcome)
        if outcome == "ok":
            d.on_done(peer, idx, now)
            if len(self._trusted) >= MAX_TRUSTED:
                self._trusted.clear()
            self._trusted.add(peer)
            # An endgame copy got here first: the other request ends now, and
            # a peer that sent no byte of it while the copy came is stalling.
            for (other, i), open_request in list(self._open.items()):
                if i == idx and other != peer:
                    open_request.scope.cancel()
            if self.store.complete(m.version):
                self.stats.completed_at.setdefault(m.version, time.time())
                queued, self._queued = self._queued, None
                if queued is not None and queued.version > m.version:
                    self._follow(queued)
            self._poke_local()
        else:
            if outcome == "bad":
                self.stats.banned.append((peer, m.version))
                self._ban(peer, "sent a chunk that failed its hash", version=m.version, chunk=idx)
            elif outcome == "denied":
                self._ban(peer, "denied a chunk it announces", version=m.version, chunk=idx)
            elif outcome == "stalled" and not self.banned(peer) and peer != self.learner_id:
                self._strike(peer)
            d.on_failed(
                peer,
                idx,
                now,
                bad=outcome in ("bad", "denied"),
                stalled=outcome == "stalled",
                busy=outcome == "busy",
                declined=outcome in ("ask_others", "overtaken"),
            )
            self._poke_downloader()

    # --- peers that waste our time -------------------------------------------------

    def banned(self, peer: str) -> bool:
        return self._banned_until.get(peer, 0.0) > trio.current_time()

    def _strike(self, peer: str) -> None:
        now = trio.current_time()
        # Bounded: stalls older than ban_s are forgotten, for every peer.
        for p in [p for p, times in self._stall_times.items() if times[-1] < now - self.config.ban_s]:
            del self._stall_times[p]
        recent = [t for t in self._stall_times.get(peer, []) if t > now - self.config.ban_s] + [now]
        self._stall_times[peer] = recent
        # A peer that never sent us a chunk has no good record to weigh
        # against a stall.
        if len(recent) >= self.config.stalls_to_ban or peer not in self._trusted:
            self._ban(peer, f"stalled {len(recent)} times")

    def _ban(self, peer: str, why: str, **fields: Any) -> None:
        now = trio.current_time()
        for p in [p for p, until in self._banned_until.items() if until < now]:  # bounded
            del self._banned_until[p]
        self._banned_until[peer] = now + self.config.ban_s
        self._stall_times.pop(peer, None)
        self.stats.peer_bans[peer] += 1
        event(
            log,
            logging.WARNING,
            f"peer {why}; asking it for nothing for {self.config.ban_s:.0f} s",
            peer=peer,
            **fields,
        )
        if self.download is not None:
            self.download.drop(peer)

    async def _request_chunk(self, m: Manifest, peer: str, idx: int, timeout_s: float) -> str:
        """One chunk request; returns ok, busy, ask_others, bad, denied, stalled
        (no byte within ``timeout_s``, or none for ``stall_s`` once they flow),
        overtaken (another peer's copy came first) or failed."""
        lanes = self._lanes.setdefault(peer, [])
        stream = lanes.pop() if lanes else None
        reusable = False
        started = trio.current_time()
        with trio.CancelScope(deadline=started + timeout_s) as scope:
            guessed = self.download is None or not self.download.durations
            open_request = self._open[(peer, idx)] = _OpenRequest(scope, started, guessed)

            def progress(n: int) -> None:
                open_request.received += n
                scope.deadline = trio.current_time() + self.config.stall_s

            try:
                if stream is None:
                    stream = await self.swarm.host.new_stream(ID.from_base58(peer), [chunk.PROTOCOL])
                reply = await chunk.ask_chunk(stream, ChunkRequest(self.job_id, m.version, idx), progress)
                reusable = True
            finally:
                self._open.pop((peer, idx), None)
                if reusable and peer in self.neighbours:
                    self._lanes.setdefault(peer, []).append(stream)
                elif stream is not None:
                    await _discard(stream)
        if scope.cancelled_caught:
            if idx in self.store.chunks_held(m.version) and open_request.received:
                return "overtaken"
            self.stats.stalls[peer] += 1
            event(log, logging.INFO, "peer stalled; reissuing", peer=peer, chunk=idx)
            return "stalled"
        if isinstance(reply, ErrorReply):
            if reply.code == chunk.UNKNOWN_CHUNK and self._announces(peer, m, idx):
                return "denied"
            return reply.code if reply.code in (chunk.BUSY, chunk.ASK_OTHERS) else "failed"
        if (reply.job_id, reply.version, reply.index) != (self.job_id, m.version, idx):
            return "bad"
        try:
            # Hashing and writing 1 MiB take milliseconds: off the event loop.
            await trio.to_thread.run_sync(self.store.save_chunk, m, idx, reply.data)
        except ChunkHashMismatch:
            return "bad"
        if not self.store.mark_held(m.version, idx):
            return "failed"  # dropped meanwhile (older than the newest K)
        self.stats.bytes_from[peer] += len(reply.data)
        self.stats.chunks_from[peer] += 1
        return "ok"

    def _holds_as_base(self, latest: Have, m: Manifest) -> bool:
        """Does a peer's Have name an update (known to us) whose base is ``m``?
        Engines fetch an update only once they hold its base in full."""
        u = self.store.manifests.get(latest.version)
        return (
            u is not None
            and u.base_version == m.version
            and latest.manifest_digest == manifest_digest(u)
            and u.base_digest == manifest_digest(m)
        )

    def _announces(self, peer: str, m: Manifest, idx: int) -> bool:
        """Does ``peer``'s latest Have still name chunk ``idx`` of ``m``?"""
        latest = self.neighbours.get(peer)
        if latest is None or latest.version != m.version or latest.manifest_digest != manifest_digest(m):
            return False
        byte = idx // 8
        return len(latest.bitfield) > byte and bool(latest.bitfield[byte] >> (idx % 8) & 1)

    # --- discovery -----------------------------------------------------------------

    async def _discover_loop(self) -> None:
        assert self._nursery is not None
        key = swarm_key(self.job_id)
        provided: set[str] = set()
        interval = self.config.discover_interval_s
        known: set[str] = set()
        unconnected: set[str] = set()
        while True:
            # (Re-)announce whenever our addresses change: a relay reservation
            # gained or lost changes how others can reach us.
            addrs = {str(a) for a in self.swarm.host.get_addrs()}
            if addrs != provided and await announce(self.swarm, key, self.config.request_timeout_s):
                provided = addrs
            found = await find_providers(self.swarm, key, self.config.request_timeout_s)
            event(log, logging.DEBUG, "swarm peers found", peers={p[-6:]: len(i.addrs) for p, i in found.items()})
            missing = {p for p in found if p != self.me and p not in self.neighbours}
            for peer in missing:
                # The smaller peer id dials first, so two peers that find each
                # other rarely open two have-streams at once; the larger one
                # dials too if the other has not within one round (its own
                # discovery may be sleeping).
                if self.me < peer or peer in unconnected:
                    self._nursery.start_soon(self.connect, found[peer])
            unconnected = missing
            new = set(found) - known
            known |= new
            others = len(found) - (self.me in found)
            enough = len(self.neighbours) >= min(self.max_neighbours, others)
            if enough:
                interval = self.config.discover_max_interval_s
            elif new:
                interval = self.config.discover_interval_s
            else:
                interval = min(interval * 2, self.config.discover_max_interval_s)
            # A periodic refresh of the neighbour set, not synchronisation.
            await trio.sleep(interval)


async def _discard(stream: INetStream) -> None:
    """Reset a stream we will not use again (shielded: runs during cancellation)."""
    with trio.move_on_after(1) as scope:
        scope.shield = True
        try:
            await stream.reset()
        except Exception:
            pass  # already reset by the remote
