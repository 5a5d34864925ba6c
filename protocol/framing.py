"""Length-prefixed frames on a byte stream.

A frame is a 4-byte big-endian length followed by that many bytes. The reader
checks the length against the caller's limit *before* reading the body, and
keeps reading until the whole frame is in: py-libp2p's yamux resets a stream
whose reader stalls for 5 s, so a frame is always drained in one go.

Works on anything with ``async read(n) -> bytes`` and ``async write(bytes)``:
a libp2p ``INetStream`` or an in-memory stream in tests.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from protocol import codec
from protocol.errors import MessageTooLarge, StreamClosed

T = TypeVar("T")
_HEADER = struct.Struct(">I")


class ByteStream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


def _is_eof(exc: BaseException) -> bool:
    # py-libp2p raises StreamEOF / StreamReset / StreamClosed (all subclasses of
    # its StreamError) where other streams return b"". Import lazily so the
    # framing stays usable without libp2p.
    from libp2p.network.stream.exceptions import StreamError

    return isinstance(exc, StreamError)


async def _read_exactly(stream: ByteStream, n: int, on_progress: Callable[[int], None] | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            piece = await stream.read(n - len(buf))
        except Exception as exc:
            if _is_eof(exc):
                piece = b""
            else:
                raise
        if not piece:
            raise StreamClosed(f"stream ended after {len(buf)} of {n} bytes", received=len(buf))
        buf += piece
        if on_progress is not None:
            on_progress(len(piece))
    return bytes(buf)


async def read_frame(stream: ByteStream, max_size: int, on_progress: Callable[[int], None] | None = None) -> bytes:
    """Read one frame; ``MessageTooLarge`` if it announces more than ``max_size``.

    ``on_progress(n)`` is called as each piece of ``n`` bytes arrives (stall
    detection for large frames).
    """
    (length,) = _HEADER.unpack(await _read_exactly(stream, _HEADER.size))
    if length > max_size:
        raise MessageTooLarge(f"frame of {length} bytes, limit {max_size}")
    return await _read_exactly(stream, length, on_progress)


async def write_frame(
    stream: ByteStream,
    payload: bytes,
    *,
    piece_size: int = 0,
    before_piece: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """Write one frame, optionally in pieces with ``await before_piece(n)``
    before each (the upload rate limit)."""
    data = _HEADER.pack(len(payload)) + payload
    if not piece_size or before_piece is None:
        await stream.write(data)
        return
    view = memoryview(data)
    for start in range(0, len(data), piece_size):
        piece = view[start : start + piece_size]
        await before_piece(len(piece))
        await stream.write(bytes(piece))


async def send(stream: ByteStream, msg: Any) -> None:
    """Encode and send one message as a frame."""
    await write_frame(stream, codec.encode(msg))


async def receive(stream: ByteStream, *expected: type[T]) -> T:
    """Read one frame and decode it as one of the ``expected`` kinds."""
    data = await read_frame(stream, codec.max_size(*expected))
    return codec.decode(data, *expected)


async def next_frame_head(stream: ByteStream) -> bytes | None:
    """The header of the stream's next frame (its 4 bytes, for a reader that
    reads the frame itself), or None if the stream ended cleanly before it."""
    try:
        return await _read_exactly(stream, _HEADER.size)
    except StreamClosed as exc:
        if exc.received == 0:
            return None
        raise


async def receive_or_end(stream: ByteStream, *expected: type[T]) -> T | None:
    """Like ``receive``, but a stream that ends cleanly *between* frames gives
    None (the peer is done with a long-lived stream); mid-frame it still raises."""
    header = await next_frame_head(stream)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    limit = codec.max_size(*expected)
    if length > limit:
        raise MessageTooLarge(f"frame of {length} bytes, limit {limit}")
    return codec.decode(await _read_exactly(stream, length), *expected)
