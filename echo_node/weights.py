"""Getting a policy version onto this node through the swarm (protocol.broadcast),
shown as a progress bar."""

from __future__ import annotations

import time

from tqdm import tqdm

from protocol.broadcast.engine import BroadcastEngine
from protocol.messages import Manifest


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
