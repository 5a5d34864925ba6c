"""The have protocol: two neighbours tell each other which chunks they hold.

A have-stream stays open while two peers are neighbours. Each side sends a
``Have`` at once and again whenever its holdings change (coalesced, at most
every ``have_interval_s``), and reads the other's continuously. Either side
closes it to stop being neighbours. A receiver ignores a ``Have`` whose
digest differs from the manifest it follows for that version (same number,
other weights, e.g. a restarted run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from protocol import framing
from protocol.framing import ByteStream
from protocol.messages import JOB_ID, MAX_CHUNKS, MAX_U53, KiB
from protocol.schema import Bytes, Int, check

PROTOCOL = "/echo-swarm/have/1.1.0"  # 1.1: base_digest


@dataclass(frozen=True)
class Have:
    """Which chunks of a version the sender holds (bit i of byte i // 8 is
    chunk i, least significant bit first). Sent on a have-stream whenever it
    changes."""

    MAX_BYTES: ClassVar[int] = MAX_CHUNKS // 8 + 1 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(Int(-1, MAX_U53)))
    manifest_digest: bytes = field(metadata=check(Bytes(0, 32)))
    bitfield: bytes = field(metadata=check(Bytes(0, MAX_CHUNKS // 8)))
    # Following an update, the digest of the base manifest the sender holds in
    # full (the base, or a variant of it); else empty.
    base_digest: bytes = field(default=b"", metadata=check(Bytes(0, 32)))


async def send(stream: ByteStream, have: Have) -> None:
    await framing.send(stream, have)


async def receive(stream: ByteStream) -> Have:
    """The neighbour's next ``Have`` (``StreamClosed`` when it has gone)."""
    return await framing.receive(stream, Have)
