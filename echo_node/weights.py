"""Getting a policy version onto this node through the swarm (protocol.broadcast),
shown as a progress bar."""

from __future__ import annotations

from protocol.broadcast.engine import BroadcastEngine
from protocol.messages import Manifest
from protocol.progress import progress


async def download_newer(engine: BroadcastEngine, manifest: Manifest, held: int) -> int:
    """Fetch ``manifest``'s version through the swarm, with a progress bar, until
    some version newer than ``held`` is complete; return the newest complete one.

    That may be an older version than ``manifest``'s: the engine finishes a
    download that is well under way before it starts a newer one.
    """
    engine.want(manifest)
    total = manifest.total_size
    with progress(f"weights v{manifest.version}", total, in_bytes=True, transient=True) as bar:

        def update(held_chunks: int, peers: int) -> None:
            bar(min(held_chunks * manifest.chunk_size, total), peers=peers)

        return await engine.wait_newer(held, update)
