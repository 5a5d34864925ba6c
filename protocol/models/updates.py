"""Policy versions shipped as updates against a base version, and rebuilt.

A manifest's ``format`` says what its chunks hold:

- ``safetensors``: the full weights (``base_version`` -1). A *base*.
- ``delta``: the version's safetensors file XOR its base's file (the two
  have the same tensors, so the same length and header), its 4-byte words
  split into four byte planes and compressed with zstd. One optimiser step
  moves each f32 weight by a tiny fraction: sign, exponent and the top
  mantissa bits stay, so the XOR's high planes are nearly all zeros and
  compress away while the low planes stay (bench/delta.py measures it).
  Decoding gives the version's file bit for bit.
- ``lora``: a safetensors file of LoRA adapter tensors (``...lora_A.weight``,
  ``...lora_B.weight`` per adapted matrix, named as PEFT saves them) with
  ``{"alpha": .., "rank": ..}`` as JSON under the metadata key ``lora``. The version's weights are the
  base's with every adapted matrix ``W`` replaced by ``W + alpha/rank * B @ A``.
- ``gguf_q8_0``: a *variant* of a base: the same version (``base_version`` is
  its own number) as a llama.cpp GGUF in q8_0, for nodes that run q8_0. They
  fetch it (about 1.06 bytes a weight) in place of the base, and then the
  base's LoRA adapters as anyone does: an update against a base accepts its
  variant as the base it names.

Every update names its base by version and by manifest digest, and every
manifest signs ``weights_digest``, the SHA-256 of the file its chunks
assemble to once decoded: the full weights for ``safetensors`` and
``delta``, the adapter file for ``lora``. A node rebuilds a version only
from a base whose manifest digest matches, and refuses any result whose
digest differs (``UpdateRefused``). Before that, every size or scale an
update declares is held against what the node allows
(``protocol.models.update_limits``): a signature says who sent an update, not that
it is sane. Merging a LoRA adapter rounds like any
other f32 arithmetic on the node's hardware, as quantising does: the signed
bytes (base and adapter) are exact, the merge is checked by the learner's
log-prob tolerance like every rollout.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import zstandard

from protocol import codec
from protocol.messages import Manifest
from protocol.models import update_limits

# Defined beside the checks; raised and taken here, and imported from here.
from protocol.models.update_limits import UpdateLimits, UpdateRefused, check_adapter

FULL, DELTA, LORA, Q8_GGUF = "safetensors", "delta", "lora", "gguf_q8_0"
FORMATS = (FULL, DELTA, LORA, Q8_GGUF)
VARIANTS = (Q8_GGUF,)
# zstd level 3: 540 MB of SmolLM2 deltas in seconds on one core; higher
# levels shrink the noise-like low planes by under 1% (bench/delta.py).
ZSTD_LEVEL = 3
WORD = 4  # f32
DECODE_BLOCK_WORDS = 4 * 2**20  # 16 MiB of weights at a time
ENCODE_BLOCK_WORDS = 2**16  # 256 KiB: a block's transpose stays in the CPU's caches
# zstd's smallest window (ZSTD_WINDOWLOG_MIN); a frame may always use it.
MIN_WINDOW = 2**10


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# --- full-weight deltas --------------------------------------------------------


def encode_delta(base: bytes, new: bytes) -> bytes | None:
    """``new`` as a delta against ``base``; None when the two files differ in
    length (other tensors: only full weights can describe it).

    The XOR of the two files, its bytes regrouped as all first bytes of each
    word, then all second bytes, ... (sign and exponent bytes barely change,
    so those planes compress to almost nothing). Built in blocks of words
    that fit the CPU's caches: the whole-file transpose took 2.7 s of the
    learner's CPU per version of SmolLM2, the blocks 0.2 s (docs/learner.md,
    "Against TRL")."""
    if len(base) != len(new):
        return None
    words = len(new) // WORD
    old_words = np.frombuffer(base, np.uint8, count=words * WORD).reshape(-1, WORD)
    new_words = np.frombuffer(new, np.uint8, count=words * WORD).reshape(-1, WORD)
    out = np.empty(len(new), np.uint8)
    planes = out[: words * WORD].reshape(WORD, words)
    for start in range(0, words, ENCODE_BLOCK_WORDS):
        stop = min(words, start + ENCODE_BLOCK_WORDS)
        planes[:, start:stop] = (old_words[start:stop] ^ new_words[start:stop]).T
    tail = slice(words * WORD, len(new))
    out[tail] = np.frombuffer(base[tail], np.uint8) ^ np.frombuffer(new[tail], np.uint8)
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(out)


def decode_delta(base: bytes, delta: bytes) -> bytes:
    """The file ``delta`` was made from; ``UpdateRefused`` if it cannot be one
    of ``base``'s length. Nothing larger than that is ever allocated: a frame
    declaring another size is refused from its header (python-zstandard's
    one-shot decoder would allocate whatever a frame declares, 8 GiB for a
    256 KiB delta), and the frames are read by a streaming decoder, its
    window bounded by the base's length, into a buffer of that length.

    Rebuilt in blocks of words, so that beyond the decompressed planes only
    the result is held (a node rebuilds 538 MB of SmolLM2 in ~2 GB, not 3).
    """
    raw = _delta_planes(delta, len(base))
    out = bytearray(base)
    result, planes = np.frombuffer(out, np.uint8), np.frombuffer(raw, np.uint8)
    words = len(raw) // WORD
    for start in range(0, words, DECODE_BLOCK_WORDS):
        stop = min(words, start + DECODE_BLOCK_WORDS)
        block = np.stack([planes[k * words + start : k * words + stop] for k in range(WORD)], axis=1)
        result[start * WORD : stop * WORD] ^= block.ravel()
    result[words * WORD :] ^= planes[words * WORD :]
    del result, planes, raw
    return bytes(out)


def _delta_planes(delta: bytes, size: int) -> bytearray:
    """The ``size`` bytes ``delta``'s zstd frames hold; ``UpdateRefused`` if
    they hold any other number, or need a window beyond ``size``."""
    try:
        frame = zstandard.get_frame_parameters(delta)
    except zstandard.ZstdError as exc:
        raise UpdateRefused(f"the delta is not a zstd frame: {exc}") from exc
    if frame.content_size not in (size, zstandard.CONTENTSIZE_UNKNOWN):
        raise UpdateRefused(f"the delta declares {frame.content_size} bytes, its base holds {size}")
    window = max(MIN_WINDOW, 1 << max(size - 1, 1).bit_length())  # the power of two >= size
    if frame.window_size > window:
        raise UpdateRefused(f"the delta asks for a {frame.window_size}-byte window, for {size} bytes")
    if frame.dict_id:
        raise UpdateRefused(f"the delta needs zstd dictionary {frame.dict_id}")
    out = bytearray(size)
    # Later frames (or a first one of unknown size) declare nothing checked
    # above: the reader fills at most ``out``, and one byte more is refused.
    reader = zstandard.ZstdDecompressor(max_window_size=window).stream_reader(delta, read_across_frames=True)
    try:
        with reader:
            got = _read_into(reader, memoryview(out))
            extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise UpdateRefused(f"the delta does not decompress: {exc}") from exc
    if got != size or extra:
        held = f"more than {size}" if extra else str(got)
        raise UpdateRefused(f"the delta holds {held} bytes, its base {size}")
    return out


def _read_into(reader: zstandard.ZstdDecompressionReader, out: memoryview) -> int:
    got = 0
    while got < len(out):
        n = reader.readinto(out[got:])
        if not n:
            break
        got += n
    return got


# --- LoRA adapters ---------------------------------------------------------------


def lora_metadata(rank: int, alpha: float) -> dict[str, str]:
    """What an adapter file carries besides its tensors: one key, as safetensors
    writes several in no fixed order (the file's bytes are signed)."""
    return {"lora": json.dumps({"alpha": alpha, "rank": rank}, sort_keys=True)}


def merge_lora(base: bytes, adapter: bytes, limits: UpdateLimits = UpdateLimits()) -> bytes:
    """The base safetensors file with the adapter merged in, as safetensors
    bytes (the merged matrices in float32); ``UpdateRefused`` if the adapter
    is beyond ``limits`` or does not fit the base."""
    from safetensors import SafetensorError
    from safetensors.torch import load, save  # torch: only where weights are merged

    try:
        weights = load(base)
    except SafetensorError as exc:
        raise UpdateRefused(f"not a safetensors file: {exc}") from exc
    return save(merged_lora(weights, adapter, limits))


def merged_lora(weights: dict[str, Any], adapter: bytes, limits: UpdateLimits = UpdateLimits()) -> dict[str, Any]:
    """``weights`` (torch tensors by name) with the adapter file merged in:
    a new dict whose adapted matrices are new float32 tensors, W + (alpha/r) B A,
    and whose other tensors are ``weights``' own (not copied). ``UpdateRefused``
    before anything is merged if the adapter is beyond ``limits`` or any of its
    pairs does not fit its base matrix."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    checked = check_adapter(adapter, limits)
    for pair in checked.pairs:
        w = weights.get(_base_name(pair.prefix) + ".weight")
        if w is None or (pair.rows, pair.columns) != tuple(w.shape):
            raise UpdateRefused(f"adapter tensor {pair.prefix} does not fit the base model")
    try:
        lora = load(adapter)
    except SafetensorError as exc:
        raise UpdateRefused(f"not a safetensors file: {exc}") from exc
    merged = dict(weights)
    scale = checked.alpha / checked.rank
    for pair in checked.pairs:
        a, b = lora[pair.prefix + ".lora_A.weight"], lora[pair.prefix + ".lora_B.weight"]
        target = _base_name(pair.prefix) + ".weight"
        w = weights[target]
        # In float32 whatever the base's dtype: rounding the merged matrix to
        # a bf16 base's dtype would move the node off the learner's policy.
        merged[target] = (w.float() + scale * (b.float() @ a.float())).contiguous()
    return merged


def lora_settings(adapter: bytes) -> tuple[int, float]:
    """An adapter file's rank and alpha; ``UpdateRefused`` if it has none, or
    they are not a positive integer and a finite number (their bounds are
    ``check_adapter``'s)."""
    try:
        meta = metadata(adapter)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UpdateRefused(f"not a LoRA adapter file: {exc}") from exc
    return update_limits.lora_settings(meta)


def metadata(data: bytes) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (read from its JSON header)."""
    if len(data) < 8:
        raise ValueError("too short for a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError("header longer than the file")
    header = json.loads(data[8 : 8 + n])
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise ValueError("__metadata__ is not a map")
    return meta


def _base_name(peft_prefix: str) -> str:
    """``base_model.model.model.layers.0.self_attn.q_proj`` -> ``model.layers.0.self_attn.q_proj``."""
    return peft_prefix.removeprefix("base_model.model.")


# --- rebuilding a version ----------------------------------------------------------


def standalone(manifest: Manifest) -> bool:
    """Does the version rebuild from its own chunks (a base or a variant),
    with no base to fetch first?"""
    return manifest.format in (FULL, *VARIANTS)


def variant_of(manifest: Manifest) -> str:
    """The variant a manifest is, as requests name it ("": a version as published)."""
    return manifest.format if manifest.format in VARIANTS else ""


def check_base(update: Manifest, base: Manifest) -> None:
    """``UpdateRefused`` unless ``base`` is exactly the version ``update`` was
    made against, or a variant of it (which names that version's digest)."""
    named = base.base_digest if base.format in VARIANTS else codec.digest(base)
    if base.version != update.base_version or named != update.base_digest:
        raise UpdateRefused(
            f"v{update.version} is an update against v{update.base_version} "
            f"({update.base_digest.hex()[:12]}), not against the v{base.version} held "
            f"({named.hex()[:12]})"
        )
    if base.format not in (FULL, *VARIANTS):
        raise UpdateRefused(f"v{update.version}'s base v{base.version} is itself an update")
    if base.format in VARIANTS and update.format != LORA:
        raise UpdateRefused(f"v{update.version} is a {update.format}: it applies to the full base, not a variant")


def check_lora(manifest: Manifest, adapter: bytes, base: Manifest | None) -> None:
    """A LoRA version's own checks, for a receiver that holds its base in full
    (every base chunk matched its signed hash): its base and its adapter file."""
    if base is None:
        raise UpdateRefused(f"v{manifest.version} needs its base v{manifest.base_version}")
    check_base(manifest, base)
    if digest(adapter) != manifest.weights_digest:
        raise UpdateRefused(f"v{manifest.version}'s adapter does not match its signed digest")


def check_signed(manifest: Manifest, payload: bytes, base: Manifest | None, base_payload: bytes | None) -> bytes:
    """Check every signed digest; the version's full weights file (for "lora",
    the adapter file, to be merged). ``UpdateRefused`` if anything differs."""
    if manifest.format != DELTA and digest(payload) != manifest.weights_digest:
        raise UpdateRefused(f"v{manifest.version}'s file does not match its signed digest")
    if manifest.format in (FULL, *VARIANTS):
        return payload
    if base is None or base_payload is None:
        raise UpdateRefused(f"v{manifest.version} needs its base v{manifest.base_version}")
    check_base(manifest, base)
    if digest(base_payload) != base.weights_digest:
        raise UpdateRefused(f"base v{base.version} does not match its signed digest")
    if manifest.format == LORA:
        return payload
    weights = decode_delta(base_payload, payload)
    if digest(weights) != manifest.weights_digest:
        raise UpdateRefused(f"v{manifest.version} rebuilt from its delta does not match its signed digest")
    return weights


def rebuild(
    manifest: Manifest,
    payload: bytes,
    base: Manifest | None,
    base_payload: bytes | None,
    limits: UpdateLimits = UpdateLimits(),
) -> bytes:
    """The full safetensors weights of ``manifest``'s version, from its
    assembled chunks (and its base's, for an update); ``UpdateRefused`` if
    anything does not match what the learner signed or declares more than
    ``limits`` allow."""
    checked = check_signed(manifest, payload, base, base_payload)
    if manifest.format == LORA:
        assert base is not None and base_payload is not None
        if base.format in VARIANTS:
            raise UpdateRefused(f"v{manifest.version}: an adapter on a {base.format} base loads in llama.cpp only")
        return merge_lora(base_payload, checked, limits)
    return checked
