"""msgpack codec: message -> bytes -> message, with a size limit per kind.

A frame is the msgpack array ``[WIRE_VERSION, kind, body]`` where ``kind`` is
the message's class name and ``body`` a map of its fields. Decoding checks the
size first, then the version and kind, then every field (``protocol.schema``).
Every failure is a ``DecodeError`` or ``MessageTooLarge``; no other exception
escapes ``decode`` whatever the bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any, TypeVar

import msgpack

from protocol import messages as m
from protocol.errors import DecodeError, MessageTooLarge
from protocol.schema import from_wire, to_wire

WIRE_VERSION = 1
T = TypeVar("T")


def _packb(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode(msg: Any) -> bytes:
    """Encode a message; raises ``MessageTooLarge`` if it exceeds its kind's limit."""
    cls = type(msg)
    limit = max_size(cls)
    data = _packb([WIRE_VERSION, cls.__name__, to_wire(msg)])
    if len(data) > limit:
        raise MessageTooLarge(f"{cls.__name__} is {len(data)} bytes, limit {limit}")
    return data


def max_size(*expected: type) -> int:
    """The largest frame any of the expected kinds may occupy (each kind's
    ``MAX_BYTES``)."""
    for cls in expected:
        if not isinstance(getattr(cls, "MAX_BYTES", None), int):
            raise TypeError(f"{cls.__name__} is not a protocol message")
    return max(cls.MAX_BYTES for cls in expected)


def decode(data: bytes, *expected: type[T]) -> T:
    """Decode bytes into one of the ``expected`` message kinds.

    Raises ``MessageTooLarge`` for oversized input (checked before parsing) and
    ``DecodeError`` for anything malformed, of the wrong version or kind, or
    with a field out of bounds.
    """
    if not expected:
        raise TypeError("decode needs at least one expected message kind")
    limit = max_size(*expected)
    if len(data) > limit:
        raise MessageTooLarge(f"{len(data)} bytes, limit {limit}")
    try:
        # Container limits stop a small frame from claiming huge arrays.
        obj = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=limit,
            max_bin_len=limit,
            max_array_len=m.MAX_CHUNKS,
            max_map_len=64,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.ExtraData) as exc:
        raise DecodeError(f"not valid msgpack: {exc}") from None
    except RecursionError:
        raise DecodeError("msgpack nesting too deep") from None
    if type(obj) is not list or len(obj) != 3:
        raise DecodeError("frame is not [version, kind, body]")
    version, kind, body = obj
    if version != WIRE_VERSION or type(version) is not int:
        raise DecodeError(f"wire version {version!r} not supported (we speak {WIRE_VERSION})")
    cls = next((c for c in expected if c.__name__ == kind), None) if type(kind) is str else None
    if cls is None:
        names = ", ".join(c.__name__ for c in expected)
        raise DecodeError(f"unexpected message kind {kind!r}, expected {names}")
    if len(data) > cls.MAX_BYTES:
        raise MessageTooLarge(f"{kind} is {len(data)} bytes, limit {cls.MAX_BYTES}")
    return from_wire(cls, body)


def _sorted(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _sorted(obj[k]) for k in sorted(obj)}
    # Schema lists are homogeneous (``ListOf``): one of scalars (token ids,
    # log-probs: most of a batch) has nothing to sort.
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], (dict, list, tuple)):
        return [_sorted(v) for v in obj]
    return obj


def canonical_bytes(msg: Any) -> bytes:
    """The bytes a signature covers: the message, signature zeroed, keys sorted.

    Prefixed with a domain tag naming the kind so that a signature over one
    kind of message can never be replayed as another kind.
    """
    body = _sorted(to_wire(m.unsigned(msg)))
    tag = f"echo-swarm/{WIRE_VERSION}/{type(msg).__name__}\0".encode()
    return tag + _packb(body)


def digest(msg: Any) -> bytes:
    """SHA-256 of a message's canonical bytes (e.g. a rollout batch's id)."""
    return hashlib.sha256(canonical_bytes(msg)).digest()
