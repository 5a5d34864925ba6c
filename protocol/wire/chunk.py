"""The chunk protocol: ask a peer for a signed manifest or one chunk of weights.

A stream carries any number of requests, each answered before the next is
sent, until the requester closes it: downloaders keep a few streams open per
peer (a fresh py-libp2p yamux stream starts with a small window). A
``ManifestRequest`` gets the ``Manifest`` (``protocol.messages``) or an
``ErrorReply``; a ``ChunkRequest`` gets ``ChunkData`` or an ``ErrorReply``
(codes below). The receiver uses a chunk only if its SHA-256 matches the
signed manifest's entry (``protocol.broadcast.store``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

from protocol import codec, framing
from protocol.framing import ByteStream
from protocol.messages import (
    JOB_ID,
    MAX_CHUNK_BYTES,
    MAX_CHUNKS,
    MAX_U53,
    VERSION,
    ErrorReply,
    KiB,
    Manifest,
)
from protocol.models.updates import VARIANTS
from protocol.schema import Bytes, Int, Str, check

# 1.1: manifests may name a base (updates); 1.2: requests name a variant.
PROTOCOL = "/echo-swarm/chunk/1.2.0"
# What a request's ``variant`` may name: "" (a version as published) or the
# format of one of its variants (``protocol.models.updates.VARIANTS``).
VARIANT = Str(16, ("", *VARIANTS))

# Error codes of this protocol (besides the shared unknown_job).
UNKNOWN_VERSION = "unknown_version"  # no manifest of that version here
UNKNOWN_CHUNK = "unknown_chunk"  # the chunk is not held (or this peer does not serve)
BUSY = "busy"  # no upload slot or queue place free: ask again later
ASK_OTHERS = "ask_others"  # a neighbour holds it too: fetch it there (asking again gets it)


@dataclass(frozen=True)
class ManifestRequest:
    """Ask a peer for a signed manifest it holds (``version`` -1: its newest),
    or for ``variant``, the manifest of that version's variant."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(Int(-1, MAX_U53)))
    variant: str = field(default="", metadata=check(VARIANT))


@dataclass(frozen=True)
class ChunkRequest:
    MAX_BYTES: ClassVar[int] = 1 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    index: int = field(metadata=check(Int(0, MAX_CHUNKS - 1)))
    variant: str = field(default="", metadata=check(VARIANT))


@dataclass(frozen=True)
class ChunkData:
    MAX_BYTES: ClassVar[int] = MAX_CHUNK_BYTES + 1 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    index: int = field(metadata=check(Int(0, MAX_CHUNKS - 1)))
    data: bytes = field(metadata=check(Bytes(0, MAX_CHUNK_BYTES)))


Request = ManifestRequest | ChunkRequest


async def ask_manifest(stream: ByteStream, request: ManifestRequest) -> Manifest | ErrorReply:
    """The client side of a manifest request (check the manifest before use)."""
    await framing.send(stream, request)
    return await framing.receive(stream, Manifest, ErrorReply)


async def ask_chunk(
    stream: ByteStream, request: ChunkRequest, on_progress: Callable[[int], None] | None = None
) -> ChunkData | ErrorReply:
    """The client side of a chunk request; ``on_progress(n)`` as each piece of
    the answer arrives (to cut a peer that stalls mid-chunk)."""
    await framing.send(stream, request)
    frame = await framing.read_frame(stream, codec.max_size(ChunkData, ErrorReply), on_progress)
    return codec.decode(frame, ChunkData, ErrorReply)


async def next_request(stream: ByteStream) -> Request | None:
    """The handler side: the next request, or None once the requester closed
    the stream between requests."""
    return await framing.receive_or_end(stream, ManifestRequest, ChunkRequest)


async def send_reply(stream: ByteStream, reply: Manifest | ErrorReply) -> None:
    await framing.send(stream, reply)


async def send_chunk(
    stream: ByteStream,
    chunk: ChunkData,
    *,
    piece_bytes: int,
    before_piece: Callable[[int], Awaitable[None]],
) -> None:
    """The handler side of an answered chunk request, sent in pieces with
    ``await before_piece(n)`` before each (the upload rate limit and stall
    deadline)."""
    await framing.write_frame(stream, codec.encode(chunk), piece_size=piece_bytes, before_piece=before_piece)
