"""The node's weight store: verified chunks on disk, keyed by their hash.

Chunks are content-addressed, so a chunk that did not change between two
versions is fetched once. Every chunk is checked against the learner-signed
manifest before it is written or used; only chunks of the newest version are
kept, which bounds disk use.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from libp2p.abc import IHost
from libp2p.peer.id import ID
from tqdm import tqdm

from protocol import manifest as manifests
from protocol.errors import ChunkHashMismatch, ProtocolError
from protocol.ids import CHUNK_PROTOCOL
from protocol.logs import event
from protocol.messages import ChunkData, ChunkRequest, ErrorReply, Manifest, ManifestRequest
from protocol.rpc import RequestFailed, request

log = logging.getLogger(__name__)


class ChunkCache:
    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: bytes) -> Path:
        return self.directory / digest.hex()

    def get(self, manifest: Manifest, index: int) -> bytes | None:
        """The cached chunk, or None if absent or damaged on disk."""
        path = self._path(manifest.chunk_hashes[index])
        try:
            data = path.read_bytes()
            manifests.check_chunk(manifest, index, data)
        except (OSError, ChunkHashMismatch):
            return None
        return data

    def put(self, digest: bytes, data: bytes) -> None:
        path = self._path(digest)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def keep_only(self, manifest: Manifest) -> None:
        wanted = {h.hex() for h in manifest.chunk_hashes}
        for path in self.directory.iterdir():
            if path.name not in wanted:
                path.unlink(missing_ok=True)


async def fetch_manifest(host: IHost, learner: ID, job_id: str, timeout_s: float) -> Manifest:
    """The learner's newest manifest, signature checked against the learner's id."""
    reply = await request(
        host, learner, CHUNK_PROTOCOL, ManifestRequest(job_id), Manifest, ErrorReply,
        timeout_s=timeout_s,
    )
    if isinstance(reply, ErrorReply):
        raise RequestFailed(f"learner refused the manifest request: {reply.code}: {reply.message}")
    try:
        manifests.check(reply, learner.to_base58())
    except ProtocolError as exc:
        raise RequestFailed(f"learner sent a bad manifest: {exc}") from exc
    if reply.job_id != job_id:
        raise RequestFailed(f"manifest is for job {reply.job_id}, not {job_id}")
    return reply


async def fetch_weights(
    host: IHost, source: ID, manifest: Manifest, cache: ChunkCache, timeout_s: float
) -> bytes:
    """All chunks of ``manifest``, from the cache or from ``source``, hash-checked."""
    parts = []
    bar = tqdm(
        total=manifest.total_size, desc=f"weights v{manifest.version}", unit="B",
        unit_scale=True, disable=None, leave=False,
    )
    for index in range(len(manifest.chunk_hashes)):
        data = cache.get(manifest, index)
        if data is None:
            reply = await request(
                host, source, CHUNK_PROTOCOL,
                ChunkRequest(manifest.job_id, manifest.version, index),
                ChunkData, ErrorReply, timeout_s=timeout_s,
            )
            if isinstance(reply, ErrorReply):
                raise RequestFailed(f"chunk {index} of v{manifest.version}: {reply.code}")
            try:
                manifests.check_chunk(manifest, index, reply.data)
            except ChunkHashMismatch:
                event(log, logging.WARNING, "peer sent a bad chunk", peer=source, index=index)
                raise
            data = reply.data
            cache.put(manifest.chunk_hashes[index], data)
        parts.append(data)
        bar.update(len(data))
    bar.close()
    return b"".join(parts)
