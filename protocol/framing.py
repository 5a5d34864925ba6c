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


async def _read_exactly(stream: ByteStream, n: int) -> bytes:
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
            raise StreamClosed(f"stream ended after {len(buf)} of {n} bytes")
        buf += piece
    return bytes(buf)


async def read_frame(stream: ByteStream, max_size: int) -> bytes:
    """Read one frame; ``MessageTooLarge`` if it announces more than ``max_size``."""
    (length,) = _HEADER.unpack(await _read_exactly(stream, _HEADER.size))
    if length > max_size:
        raise MessageTooLarge(f"frame of {length} bytes, limit {max_size}")
    return await _read_exactly(stream, length)


async def write_frame(stream: ByteStream, payload: bytes) -> None:
    await stream.write(_HEADER.pack(len(payload)) + payload)


async def send(stream: ByteStream, msg: Any) -> None:
    """Encode and send one message as a frame."""
    await write_frame(stream, codec.encode(msg))


async def receive(stream: ByteStream, *expected: type[T]) -> T:
    """Read one frame and decode it as one of the ``expected`` kinds."""
    data = await read_frame(stream, codec.max_size(*expected))
    return codec.decode(data, *expected)
