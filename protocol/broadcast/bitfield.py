"""Chunk sets as compact bitfields: bit i of byte i // 8 is chunk i, LSB first."""

from __future__ import annotations

from collections.abc import Iterable

from protocol.errors import DecodeError


def encode(chunks: Iterable[int], n_chunks: int) -> bytes:
    out = bytearray((n_chunks + 7) // 8)
    for i in chunks:
        out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def common(a: bytes, b: bytes) -> int:
    """How many chunks two bitfields of one version both name."""
    return sum((x & y).bit_count() for x, y in zip(a, b))


def decode(data: bytes, n_chunks: int) -> frozenset[int]:
    if len(data) != (n_chunks + 7) // 8:
        raise DecodeError(f"bitfield of {len(data)} bytes for {n_chunks} chunks")
    chunks = frozenset(byte_i * 8 + bit for byte_i, byte in enumerate(data) for bit in range(8) if byte >> bit & 1)
    if chunks and max(chunks) >= n_chunks:
        raise DecodeError(f"bitfield names chunk {max(chunks)} of {n_chunks}")
    return chunks
