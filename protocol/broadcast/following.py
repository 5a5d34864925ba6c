"""Following the newest version: learning of it from a neighbour's Have,
fetching its manifest (checked against the learner's key; in this process's
variant where the learner publishes one), and choosing what to download next.

A download at least half done is finished first and the newest version
queued behind it (``state.queued``); an update against a base not held in full
waits, queued, for its base. ``start_download`` hands a version to the
download loop (``protocol.broadcast.downloads``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID

from protocol import manifest as manifests
from protocol.broadcast.state import PEER_ERRORS, EngineState
from protocol.errors import ProtocolError
from protocol.manifest import manifest_digest
from protocol.messages import ErrorReply, Manifest
from protocol.models import updates
from protocol.process.logs import event
from protocol.rpc import RequestFailed, request
from protocol.wire import chunk
from protocol.wire.chunk import ManifestRequest

log = logging.getLogger(__name__)

# Versions remembered as having no variant (asked once each).
MAX_WITHOUT_VARIANT = 1024


class VersionTooLarge(RequestFailed):
    """A signed manifest asks for more disk than ``max_version_bytes`` allows."""


class Following:
    def __init__(self, state: EngineState, *, variant: str, start_download: Callable[[Manifest], None]):
        """``variant``: the variant format this process runs bases in, if the
        learner publishes one ("" for none)."""
        self.state = state
        self.variant = variant
        self.start_download = start_download
        self._learning: set[int] = set()  # versions whose manifest is being fetched
        self._without_variant: set[int] = set()
        self._nursery: trio.Nursery | None = None  # where fetches run, once ``run`` runs

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Runs until cancelled: the manifest fetches run under it."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def want(self, manifest: Manifest) -> None:
        """Download ``manifest``'s version if it is newer than what we follow.

        A download at least half done is finished first and the newest version
        queued behind it: when versions come faster than one broadcast takes
        (async training), switching at every announcement would never complete
        any, while a finished older version is still inside the learner's
        staleness window.
        """
        s = self.state
        newest = s.newest_wanted()
        if newest is not None and manifest.version < newest.version:
            return
        if newest is not None and manifest.version == newest.version:
            if manifest_digest(manifest) == manifest_digest(newest):
                return
        held = s.store.manifests.get(manifest.version)
        if held is not None and manifest_digest(held) != manifest_digest(manifest):
            return  # the version is held in another form (e.g. its variant): keep that
        s.store.add_manifest(manifest)
        if self._finishing_first():
            s.queued = manifest
            s.poke_local()
            return
        self.follow(manifest)

    def follow(self, m: Manifest) -> None:
        """Download ``m``'s version, or first its base if it is an update
        against a base not held in full (``m`` waits queued meanwhile)."""
        s = self.state
        if updates.standalone(m) or s.store.complete(m.base_version) and s.store.base_of(m.version):
            self.start_download(m)
            return
        s.queued = m
        base = s.store.base_of(m.version)
        if base is not None:
            self.start_download(base)
        elif self._nursery is not None and m.base_version not in self._learning:
            self._learning.add(m.base_version)
            self._nursery.start_soon(self._fetch_base, m)

    def downloaded(self, m: Manifest) -> None:
        """``m``'s version is complete: on to the version queued behind it."""
        queued, self.state.queued = self.state.queued, None
        if queued is not None and queued.version > m.version:
            self.follow(queued)

    def learn(self, peer: str, version: int) -> None:
        """``peer`` announces ``version``, newer than what we follow: fetch its manifest."""
        if version in self._learning or self._nursery is None:
            return
        self._learning.add(version)
        self._nursery.start_soon(self._fetch_manifest, peer, version)

    def _finishing_first(self) -> bool:
        s = self.state
        m = s.target
        if m is None or s.is_seed or s.download is None:
            return False
        held, n = len(s.store.chunks_held(m.version)), len(m.chunk_hashes)
        return held < n and 2 * held >= n

    async def _fetch_base(self, update: Manifest) -> None:
        """Get the manifest of ``update``'s base (in our variant if there is
        one), from the learner or else a neighbour."""
        s = self.state
        try:
            for peer in [s.learner_id, *(p for p in s.neighbours if p != s.learner_id)]:
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
                    if s.queued is update:
                        s.queued = None
                    return
                s.store.add_manifest(base)
                if s.queued is update:
                    self.start_download(base)
                return
        finally:
            self._learning.discard(update.base_version)

    async def fetch_manifest(self, peer: str, version: int = -1, variant: str = "") -> Manifest:
        """Manifest ``version`` (-1: the newest; ``variant``: of that variant)
        from ``peer``, checked against the job and the learner's key;
        ``RequestFailed`` otherwise."""
        s = self.state
        ask = ManifestRequest(s.job_id, version, variant)
        reply = await request(
            s.swarm.host,
            ID.from_base58(peer),
            chunk.PROTOCOL,
            lambda stream: chunk.ask_manifest(stream, ask),
            timeout_s=s.config.request_timeout_s,
        )
        if isinstance(reply, ErrorReply):
            raise RequestFailed(f"{peer} has no manifest v{version}: {reply.code}")
        if reply.job_id != s.job_id or version >= 0 and reply.version != version:
            raise RequestFailed(f"{peer} sent the manifest of v{reply.version} of job {reply.job_id}")
        if updates.variant_of(reply) != variant:
            raise RequestFailed(f"{peer} sent a {reply.format} manifest, not a {variant or 'published'} one")
        try:
            manifests.check(reply, s.learner_id)
        except ProtocolError as exc:
            raise RequestFailed(f"{peer} sent a manifest that fails its check: {exc}") from exc
        if s.config.max_version_bytes and reply.total_size > s.config.max_version_bytes:
            raise VersionTooLarge(
                f"version {reply.version} is {reply.total_size / 2**30:.2f} GiB, more than this "
                f"process may store per version ({s.config.max_version_bytes / 2**30:.2f} GiB)"
            )
        return reply

    async def fetch_manifest_to_follow(self, peer: str, version: int = -1) -> Manifest:
        """The manifest of ``version`` (-1: the newest ``peer`` holds) to
        follow: its variant, where this process runs bases in one and the
        version has it (asked of ``peer``, then of the learner), else itself."""
        m = await self.fetch_manifest(peer, version)
        if not self.variant or m.format != updates.FULL or m.version in self._without_variant:
            return m
        for source in dict.fromkeys((peer, self.state.learner_id)):
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
