"""GPT-2's byte-level alphabet: byte ``b`` <-> one printable character.

The built-in model's tokenizer (token id ``b`` is byte ``b``) and the node's
GGUF export both spell byte tokens this way, so they share this table.
"""

from __future__ import annotations

from functools import cache


@cache
def byte_chars() -> tuple[str, ...]:
    """Character ``i`` stands for byte ``i``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))
