"""A safetensors file's header, read from bytes a stranger sent: its length
checked against a limit before anything is parsed, then JSON that must be a
table. One reader for every role (a node's weights guard, an update's
limits), so that what they refuse cannot drift apart."""

from __future__ import annotations

import json
import struct


class BadHeader(ValueError):
    """The bytes do not start with a safetensors header within the limit."""


def read_header(data: bytes | memoryview, max_header: int) -> tuple[dict, memoryview]:
    """The header's table and the data after it; ``BadHeader`` (with a
    reason for people) for anything else, including JSON nested deeply
    enough to exhaust the parser (``RecursionError``)."""
    if len(data) < 8:
        raise BadHeader("shorter than a safetensors header")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > max_header or 8 + n > len(data):
        raise BadHeader(f"a safetensors header of {n} bytes (at most {max_header}, inside a file of {len(data)})")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadHeader(f"the safetensors header is not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise BadHeader("the safetensors header is not a table")
    return header, memoryview(data)[8 + n :]
