"""Pieces of the hostile peers the benchmarks and attack drills run."""

from __future__ import annotations

from protocol.broadcast import bitfield
from protocol.broadcast.engine import BroadcastEngine
from protocol.manifest import manifest_digest
from protocol.wire.have import Have


def claim_everything(engine: BroadcastEngine) -> Have:
    """A Have that names every chunk of the version ``engine`` follows,
    whatever it holds (to replace ``engine.haves.my_have``)."""
    m = engine.target
    if m is None:
        return Have(engine.job_id, -1, b"", b"")
    n = len(m.chunk_hashes)
    return Have(engine.job_id, m.version, manifest_digest(m), bitfield.encode(range(n), n))
