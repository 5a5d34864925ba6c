"""How much memory generation needs, and what fits on this node.

Checked before a job's model is loaded (the weights and llama.cpp's KV cache)
and before each assignment (torch's KV cache and the logits of every
sequence generated at once), against what the device has free at that moment
and ``--max-memory``: a volunteer's machine never swaps or gets OOM-killed.
What does not fit is refused with one line saying what it would need; where
the node may choose, it runs smaller instead: a smaller llama.cpp dtype
(``--dtype auto``), fewer prompts per generate call.

The estimates are upper bounds from the model's shape (``guard.ModelShape``);
``tests/node/test_memory.py`` holds them above what torch and llama.cpp
really allocate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from echo_node.device import Device, available_ram
from echo_node.guard import ModelShape, Refused

if TYPE_CHECKING:
    from echo_node.backend import Backend

MiB = 2**20
GiB = 2**30
# Left free for the volunteer's other programs (and our own Python heap).
HEADROOM = 512 * MiB
# What a weight takes in each dtype (q8_0: 32 int8 weights and one f16 scale).
WEIGHT_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}
# --dtype auto on llama.cpp: the most exact that fits (the learner allows for each).
LLAMA_DTYPES = ("f32", "f16", "q8_0")
F32_BYTES = 4  # llama.cpp's GGUF export widens every tensor to f32 first
KV_BYTES = 4  # both backends keep an f32 KV cache (exact log-probs; backend_llama.py)
LLAMA_CELLS = 4096  # llama.cpp's context: KV cells shared by one call's sequences


@dataclass(frozen=True)
class Need:
    """Bytes one step of the node's work allocates."""

    weights: int = 0
    cache: int = 0
    buffers: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.cache + self.buffers

    def __add__(self, other: Need) -> Need:
        return Need(self.weights + other.weights, self.cache + other.cache, self.buffers + other.buffers)

    def describe(self) -> str:
        return (
            f"{gib(self.total)} (weights {gib(self.weights)}, KV cache {gib(self.cache)}, buffers {gib(self.buffers)})"
        )


def gib(n: float) -> str:
    """Bytes for people: GiB, or MiB below one GiB."""
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def kv_bytes_per_token(shape: ModelShape) -> int:
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * KV_BYTES  # keys and values


def load_need(shape: ModelShape, backend: str, dtype: str, *, variant: str = "", lora: bool = False) -> Need:
    """Building a version (while the one before still generates, and is
    counted as in use): the model in ``dtype`` and, for llama.cpp, the
    context's KV cache (allocated when the model loads), with what it is
    built from:

    - the published file (in the model's own dtype, ``shape.wire_bytes`` a
      weight) and its tensors being converted (torch: loaded as published;
      llama.cpp: widened to f32 for the GGUF export);
    - a ``variant``, a GGUF already in ``dtype``: the file, twice while its
      chunks are joined;
    - a ``lora`` version on torch: the base's tensors as published (kept
      between versions) and the adapted matrices merged in f32.

    Measured against the peak RSS of a Qwen3-0.6B-shaped swarm in
    ``bench/models.py`` (docs/inference.md)."""
    if variant:
        per_weight = 3 * WEIGHT_BYTES[dtype]
    elif lora and backend == "torch":
        per_weight = WEIGHT_BYTES[dtype] + shape.wire_bytes + F32_BYTES
    else:
        converted = F32_BYTES if backend == "llama" else shape.wire_bytes
        per_weight = WEIGHT_BYTES[dtype] + shape.wire_bytes + converted
    weights = int(shape.parameters * per_weight)
    cache = kv_bytes_per_token(shape) * LLAMA_CELLS if backend == "llama" else 0
    return Need(weights=weights, cache=cache)


def gpu_layers(shape: ModelShape, dtype: str, free: int) -> int:
    """How many of the model's layers llama.cpp may offload to a GPU with
    ``free`` bytes (-1: all of them)."""
    # Embeddings spread over the layers: an over-estimate, on the safe side.
    per_layer = (shape.parameters * WEIGHT_BYTES[dtype] + kv_bytes_per_token(shape) * LLAMA_CELLS) / shape.layers
    fit = int(free // per_layer)
    return -1 if fit >= shape.layers else fit


def call_need(shape: ModelShape, backend: str, sequences: int, prompt_tokens: int, new_tokens: int) -> Need:
    """One generate call of ``sequences`` sequences of up to ``prompt_tokens``
    + ``new_tokens`` tokens, beyond what the loaded model already holds."""
    if backend == "llama":
        # The KV cache came with the model; llama.cpp's output buffer holds,
        # per sampled row, the scaled logits, the probabilities (f32) and the
        # candidate ids (int32) of the whole vocabulary (echo_node/llama_decode.py).
        return Need(buffers=sequences * shape.vocab * (4 + 4 + 4))
    cache = kv_bytes_per_token(shape) * sequences * (prompt_tokens + new_tokens)
    # transformers' generate keeps every step's logits (output_logits); they
    # are then stacked, scaled and log-softmaxed: 4 copies, measured 3.9 at
    # the peak (tests/node/test_memory.py), so 5.
    buffers = sequences * new_tokens * shape.vocab * 4 * 5
    return Need(cache=cache, buffers=buffers)


def free_bytes(device: Device, max_memory: int) -> int:
    """What new allocations may take now: the device's free memory less
    ``HEADROOM``, and never past ``max_memory`` (0: no cap) for this process."""
    if device.kind == "cuda":
        import torch

        free = int(torch.cuda.mem_get_info()[0])
        used = int(torch.cuda.memory_reserved())
    elif device.kind == "cpu" or device.kind == "mps":  # Apple GPUs share the RAM
        import psutil

        free = available_ram()
        used = int(psutil.Process(os.getpid()).memory_info().rss)
    else:  # a llama.cpp GPU nothing tells the size of: the user's cap alone
        free, used = device.memory or 1 << 60, 0
    if max_memory:
        free = min(free, max_memory - used)
    return max(0, free - HEADROOM)


def choose_dtype(shape: ModelShape, backend: str, asked: str, free: int) -> str:
    """The dtype to run the model in: ``asked``, or with ``auto`` the most
    exact llama.cpp dtype whose model and one sequence fit ``free``. Raises
    ``Refused`` with what it would need."""
    candidates = (LLAMA_DTYPES if backend == "llama" else ("f32",)) if asked == "auto" else (asked,)
    for dtype in candidates:
        need = load_need(shape, backend, dtype) + call_need(shape, backend, 1, 0, 1)
        if need.total <= free:
            return dtype
    smaller = "" if backend == "llama" else " (llama.cpp runs it smaller: --backend llama --dtype auto)"
    raise Refused(
        f"the job's model ({shape.parameters / 1e6:,.0f}M parameters) needs about "
        f"{need.describe()} with {backend} {dtype}; {gib(free)} is free "
        f"(--max-memory, less {gib(HEADROOM)} kept free){smaller}"
    )


def fit_backend(backend: Backend, shape: ModelShape, free: int) -> Need:
    """Fit ``backend`` to a job's model:
    its dtype (``auto``: the most exact that fits ``free``) and, for
    llama.cpp on a GPU, the layers to offload. Raises ``Refused`` when
    nothing fits; returns what loading a version will need."""
    dtype = choose_dtype(shape, backend.name, "auto" if backend.auto_dtype else backend.dtype, free)
    if backend.auto_dtype:
        backend.dtype, backend.auto_dtype = dtype, False
    if backend.name == "llama" and backend.device.gpu:
        backend.gpu_layers = gpu_layers(shape, dtype, free)  # type: ignore[attr-defined]
    return load_need(shape, backend.name, dtype)


def prompts_per_call(
    shape: ModelShape, backend: str, prompts: int, group_size: int, prompt_tokens: int, new_tokens: int, free: int
) -> int:
    """How many of an assignment's prompts to generate at once so that the
    call fits ``free``. Raises ``Refused`` when not even one group fits."""
    one = call_need(shape, backend, group_size, prompt_tokens, new_tokens)
    if one.total > free:
        raise Refused(
            f"one prompt's group of {group_size} x {new_tokens} tokens needs about "
            f"{one.describe()}; {gib(free)} is free"
        )
    return max(1, min(prompts, free // max(one.total, 1)))
