"""bench/fuzz.py's targets for what a learner's updates hold (``protocol.models.updates``):
delta frames, adapter files and adapter headers.

The learner signs these, so their attacker is a learner key the node trusts
(leaked, or a hostile operator's invite). Each target must rebuild or raise
``UpdateRefused``, and no case may allocate beyond what the node allows for
it (``PEAK_BOUNDS``, checked on every case, not every ``TRACE_EVERY``-th).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import zstandard
from hypothesis import strategies as st
from safetensors.numpy import save

from protocol.models import updates
from protocol.models.update_limits import UpdateLimits

LIMITS = UpdateLimits()
BASE = np.random.default_rng(0).bytes(4096)  # a delta's base: 1,024 f32 weights
DIM, RANK = 8, 2
PEFT = "base_model.model.model.layers.0.self_attn.q_proj"
# Allocation overhead of one case that holds no input-sized data: tracebacks,
# numpy's and json's small objects.
OVERHEAD = 256 * 1024


def _delta_bound(_case: object) -> int:
    """What a delta's rebuild holds at once: the planes, the result, one
    block of words and the returned copy, each the base's length."""
    return 4 * len(BASE) + OVERHEAD


def _adapter_bound(case: bytes) -> int:
    """An adapter's checks and merge hold the file's tensors (as float32: at
    most twice a half-precision file), its header as JSON objects, and the
    base's adapted matrices; each within a few times the file."""
    return 8 * len(case) + 64 * DIM * DIM + OVERHEAD


def declaring(size: int, content: bytes) -> bytes:
    """An unfinished zstd frame whose header declares ``size`` bytes (zstd
    will not write more than it declares)."""
    writer = zstandard.ZstdCompressor(level=3).compressobj(size=size)
    return writer.compress(content[:size]) + writer.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)


def unsized(content: bytes, window_log: int) -> bytes:
    """A complete zstd frame of unknown content size and the given window."""
    params = zstandard.ZstdCompressionParameters(window_log=window_log, write_content_size=False)
    return zstandard.ZstdCompressor(compression_params=params).compress(content)


def adapter(rank: int = RANK, alpha: object = 4.0, a_shape=(RANK, DIM), b_shape=(DIM, RANK), value=0.1) -> bytes:
    a, b = np.full(a_shape, value, np.float32), np.full(b_shape, value, np.float32)
    meta = {"lora": json.dumps({"alpha": alpha, "rank": rank})}
    return save({PEFT + ".lora_A.weight": a, PEFT + ".lora_B.weight": b}, metadata=meta)


def with_header(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + body


GOOD_DELTA = updates.encode_delta(BASE, BASE[::-1])
GOOD_ADAPTER = adapter()


def _base_weights() -> dict:
    import torch

    return {"model.layers.0.self_attn.q_proj.weight": torch.eye(DIM)}


BASE_WEIGHTS = _base_weights()


# --- targets ------------------------------------------------------------------------


def delta_frames(data: bytes) -> None:
    assert updates.decode_delta(BASE, data) is not None


def adapter_files(data: bytes) -> None:
    """The torch node's path: every check, then the merge into the base."""
    merged = updates.merged_lora(BASE_WEIGHTS, data, LIMITS)
    assert all(bool(t.isfinite().all()) for t in merged.values())


def adapter_headers(data: bytes) -> None:
    """The llama.cpp node's path up to the GGUF writer: the checks, and the
    rank and alpha it reads."""
    updates.check_adapter(data, LIMITS)
    updates.lora_settings(data)


def _mutate(mutate: Callable, flips: st.SearchStrategy) -> Callable[[bytes], st.SearchStrategy]:
    return lambda data: st.builds(mutate, st.just(data), flips)


def targets(mutate: Callable, flips: st.SearchStrategy) -> dict[str, tuple[Callable, st.SearchStrategy, float]]:
    """name: (target, inputs, share of the cases), as bench/fuzz.py's TARGETS."""
    sizes = st.integers(0, 2**64 - 2) | st.sampled_from([len(BASE), len(BASE) + 1, 8 * 2**30])
    content = st.binary(max_size=8192)
    numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70) | st.text(max_size=4)
    dims = st.integers(0, 12)
    entry = st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["F32", "F16", "BF16", "I64", "F64"]),
            "shape": st.lists(st.integers(-1, 2**40), max_size=3),
            "data_offsets": st.lists(st.integers(-1, 2**40), max_size=3),
        }
    )
    names = st.sampled_from([PEFT + ".lora_A.weight", PEFT + ".lora_B.weight", "other.weight", "__metadata__"])
    return {
        "delta_frames": (
            delta_frames,
            st.builds(declaring, sizes, content)
            | st.builds(unsized, content, st.integers(10, 27))
            | _mutate(mutate, flips)(GOOD_DELTA)
            | st.builds(lambda extra: GOOD_DELTA + extra, st.binary(max_size=64) | st.just(GOOD_DELTA))
            | st.binary(max_size=512),
            0.4,
        ),
        "adapter_files": (
            adapter_files,
            _mutate(mutate, flips)(GOOD_ADAPTER)
            | st.builds(
                adapter,
                st.integers(-2, 12),
                numbers,
                st.tuples(dims, dims),
                st.tuples(dims, dims),
                st.floats(allow_nan=True, allow_infinity=True, width=32),
            ),
            0.35,
        ),
        "adapter_headers": (
            adapter_headers,
            st.builds(with_header, st.dictionaries(names, entry, max_size=4), st.binary(max_size=256))
            | st.builds(
                lambda n, rest: n.to_bytes(8, "little") + rest, st.integers(0, 2**64 - 1), st.binary(max_size=256)
            ),
            0.25,
        ),
    }


PEAK_BOUNDS: dict[str, Callable[[bytes], int]] = {
    "delta_frames": _delta_bound,
    "adapter_files": _adapter_bound,
    "adapter_headers": _adapter_bound,
}
