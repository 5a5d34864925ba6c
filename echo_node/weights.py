"""Getting a policy version onto this node: its manifest from the learner, its
chunks from the swarm (protocol.broadcast), shown as a progress bar."""

from __future__ import annotations

import time

from libp2p.abc import IHost
from libp2p.peer.id import ID
from tqdm import tqdm

from protocol import manifest as manifests
from protocol.broadcast.engine import BroadcastEngine
from protocol.errors import ProtocolError
from protocol.ids import CHUNK_PROTOCOL
from protocol.messages import ErrorReply, Manifest, ManifestRequest
from protocol.rpc import RequestFailed, request


async def fetch_manifest(host: IHost, learner: ID, job_id: str, timeout_s: float) -> Manifest:
    """The learner's newest manifest, signature checked against the learner's id."""
    reply = await request(
        host, learner, CHUNK_PROTOCOL, ManifestRequest(job_id, -1), Manifest, ErrorReply,
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


async def download(engine: BroadcastEngine, manifest: Manifest) -> bool:
    """Fetch ``manifest``'s version through the swarm with a progress bar.

    True once it is complete on disk; False if a newer version replaced it.
    """
    engine.want(manifest)
    n = len(manifest.chunk_hashes)
    start = time.monotonic()
    bar = tqdm(total=n, desc=f"weights v{manifest.version}", unit="chunk", disable=None, leave=False)

    def progress(held: int, peers: int) -> None:
        mb = held * manifest.chunk_size / 1e6
        bar.n = held
        bar.set_postfix(MBps=f"{mb / max(time.monotonic() - start, 1e-3):.1f}", peers=peers)

    try:
        return await engine.wait_complete(manifest.version, progress)
    finally:
        bar.close()
