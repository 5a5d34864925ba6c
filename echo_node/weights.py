"""Getting a policy version onto this node through the swarm (protocol.broadcast),
shown as a progress bar."""

from __future__ import annotations

import time

from tqdm import tqdm

from protocol.broadcast.engine import BroadcastEngine
from protocol.messages import Manifest


async def download_newer(engine: BroadcastEngine, manifest: Manifest, held: int) -> int:
    """Fetch ``manifest``'s version through the swarm, with a progress bar, until
    some version newer than ``held`` is complete; return the newest complete one.

    That may be an older version than ``manifest``'s: the engine finishes a
    download that is well under way before it starts a newer one.
    """
    engine.want(manifest)
    start = time.monotonic()
    bar = tqdm(
        total=len(manifest.chunk_hashes), desc=f"weights v{manifest.version}", unit="chunk", disable=None, leave=False
    )

    def progress(held_chunks: int, peers: int) -> None:
        mb = held_chunks * manifest.chunk_size / 1e6
        bar.n = held_chunks
        bar.set_postfix(MBps=f"{mb / max(time.monotonic() - start, 1e-3):.1f}", peers=peers)

    try:
        return await engine.wait_newer(held, progress)
    finally:
        bar.close()
