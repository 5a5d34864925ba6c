"""How much memory generation needs, and what fits on this node.

Checked before a job's model is loaded (the weights and llama.cpp's KV cache)
and before each assignment (torch's KV cache and one step's logits for
every sequence generated at once), against what the device has free at that moment
and ``--max-memory``: a volunteer's machine never swaps or gets OOM-killed.
What does not fit is refused with one line saying what it would need; where
the node may choose, it runs smaller instead: a smaller llama.cpp dtype
(``--dtype auto``), fewer prompts per generate call.

The estimates are upper bounds from the model's shape (``guard.ModelShape``);
``tests/node/test_memory.py`` holds them above what torch and llama.cpp
really allocate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from echo_node.device import Device
from echo_node.model_shape import ModelShape
from echo_node.refusals import Refused

if TYPE_CHECKING:
    from echo_node.backend import Backend, BackendSpec

MiB = 2**20
GiB = 2**30
# Left free for the volunteer's other programs (and our own Python heap).
HEADROOM = 512 * MiB
# What a weight takes in each dtype (q8_0: 32 int8 weights and one f16 scale).
WEIGHT_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}
F32_BYTES = 4  # a weight widened to f32 (llama.cpp's export; torch's merged LoRA matrices)
KV_BYTES = 4  # both backends keep an f32 KV cache (exact log-probs; backend_llama.py)


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


def load_need(
    shape: ModelShape,
    backend: BackendSpec,
    dtype: str,
    *,
    variant: str = "",
    lora: bool = False,
    cells: int | None = None,
) -> Need:
    """Building a version (while the one before still generates, and is
    counted as in use): the model in ``dtype`` and, for llama.cpp, the
    context's KV cache (allocated when the model loads: ``cells``, by default
    the backend's on the CPU), with what it is built from:

    - the published file (in the model's own dtype, ``shape.wire_bytes`` a
      weight) and its tensors being converted (torch: loaded as published;
      llama.cpp: widened to f32 for the GGUF export);
    - a ``variant``, a GGUF already in ``dtype``: the file, twice while its
      chunks are joined;
    - a ``lora`` version on a backend that merges adapters (torch): the
      base's tensors as published (kept between versions) and the adapted
      matrices merged in f32.

    Measured against the peak RSS of a Qwen3-0.6B-shaped swarm in
    ``bench/models.py`` (docs/inference.md)."""
    if variant:
        per_weight = 3 * WEIGHT_BYTES[dtype]
    elif lora and backend.merges_lora:
        per_weight = WEIGHT_BYTES[dtype] + shape.wire_bytes + F32_BYTES
    else:
        converted = shape.wire_bytes if backend.converted_bytes is None else backend.converted_bytes
        per_weight = WEIGHT_BYTES[dtype] + shape.wire_bytes + converted
    weights = int(shape.parameters * per_weight)
    cache = kv_bytes_per_token(shape) * (backend.kv_cells if cells is None else cells)
    return Need(weights=weights, cache=cache)


def gpu_cells(shape: ModelShape, backend: BackendSpec, dtype: str, free: int) -> int:
    """KV cells for a context that comes with the model, on a GPU with
    ``free`` bytes: what is left beside the model, with room for the next
    version's model while this one generates, a quarter of it for the
    context (the next version's context and its host-side conversion need
    room too), in cells of ``backend.cell_bytes``; up to ``backend.gpu_cells``
    and never fewer than on the CPU (then fewer layers go to the GPU)."""
    if not backend.gpu_cells or backend.cell_bytes is None:
        return backend.kv_cells
    left = free - 2 * shape.parameters * WEIGHT_BYTES[dtype]
    cells = max(0, left) // (4 * backend.cell_bytes(shape)) // 256 * 256
    return int(max(backend.kv_cells, min(backend.gpu_cells, cells)))


def gpu_layers(shape: ModelShape, dtype: str, free: int, cells: int) -> int:
    """How many of the model's layers a backend that offloads layers may put
    on a GPU with ``free`` bytes, with a KV cache of ``cells`` (-1: all of them)."""
    # Embeddings spread over the layers: an over-estimate, on the safe side.
    per_layer = (shape.parameters * WEIGHT_BYTES[dtype] + kv_bytes_per_token(shape) * cells) / shape.layers
    fit = int(free // per_layer)
    return -1 if fit >= shape.layers else fit


def call_need(shape: ModelShape, backend: BackendSpec, sequences: int, prompt_tokens: int, new_tokens: int) -> Need:
    """One generate call of ``sequences`` sequences of up to ``prompt_tokens``
    + ``new_tokens`` tokens, beyond what the loaded model already holds
    (the backend's ``BackendSpec.call_need``)."""
    return backend.call_need(shape, sequences, prompt_tokens, new_tokens)


def free_bytes(device: Device, max_memory: int) -> int:
    """What new allocations may take now: the device's free memory less
    ``HEADROOM``, and never past ``max_memory`` (0: no cap) for this process."""
    free, used = device.usage()
    if max_memory:
        free = min(free, max_memory - used)
    return max(0, free - HEADROOM)


def choose_dtype(shape: ModelShape, backend: BackendSpec, asked: str, free: int) -> str:
    """The dtype to run the model in: ``asked``, or with ``auto`` the most
    exact of the backend's ``auto_dtypes`` whose model and one sequence fit
    ``free``. Raises ``Refused`` with what it would need."""
    for dtype in backend.auto_dtypes if asked == "auto" else (asked,):
        need = load_need(shape, backend, dtype) + call_need(shape, backend, 1, 0, 1)
        if need.total <= free:
            return dtype
    raise Refused(
        f"the job's model ({shape.parameters / 1e6:,.0f}M parameters) needs about "
        f"{need.describe()} with {backend.name} {dtype}; {gib(free)} is free "
        f"(--max-memory, less {gib(HEADROOM)} kept free){backend.smaller}"
    )


def fit_backend(backend: Backend, shape: ModelShape, free: int) -> Need:
    """Fit ``backend`` to a job's model:
    its dtype (``auto``: the most exact that fits ``free``) and, for a
    backend that offloads layers to a GPU, its context's cells there and how
    many layers. Raises ``Refused`` when nothing fits; returns what loading
    a version will need."""
    dtype = choose_dtype(shape, backend.spec, "auto" if backend.auto_dtype else backend.dtype, free)
    if backend.auto_dtype:
        backend.dtype, backend.auto_dtype = dtype, False
    if backend.spec.offloads_layers and backend.device.gpu:
        backend.kv_cells = gpu_cells(shape, backend.spec, dtype, free)
        backend.gpu_layers = gpu_layers(shape, dtype, free, backend.kv_cells)  # type: ignore[attr-defined]
    return load_need(shape, backend.spec, dtype, cells=backend.kv_cells)


def prompts_per_call(
    shape: ModelShape,
    backend: BackendSpec,
    prompts: int,
    group_size: int,
    prompt_tokens: int,
    new_tokens: int,
    free: int,
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
