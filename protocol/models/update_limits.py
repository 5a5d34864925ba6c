"""What an update may declare, checked before anything is allocated for it.

A node rebuilds only what its learner signed, but a signature says who sent
an update, not that it is sane: a learner key can leak, and an invite can
come from a hostile operator. So every size or scale an update declares is
held against what the node allows before the node acts on it:

- a ``delta``'s zstd frames must rebuild exactly the base's length
  (``protocol.models.updates.decode_delta``: a frame that declares more is refused
  from its header, and the decoder's window is bounded by that length);
- a ``lora`` adapter file (``check_adapter``): its safetensors header is
  bounded and points inside the file; every tensor is a 2-D lora_A/lora_B
  half of a pair whose rank is the declared one and at most the adapted
  matrix's smaller side; alpha/rank is finite and within ``max_lora_scale``;
  every value is finite and within ``max_lora_value``. Whether each pair fits
  the base's matrix is checked where the base's shapes are known (the torch
  merge, ``protocol.models.updates.merged_lora``; llama.cpp's adapter loader).

A refusal is ``UpdateRefused``: the node logs it and keeps the version it runs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np

from protocol.errors import ProtocolError
from protocol.models.safetensors_header import BadHeader, read_header
from protocol.process.config import setting

# ...q_proj.lora_A.weight, as PEFT saves adapters (``echo_learner.training.lora``).
_HALF = re.compile(r"(?P<prefix>.+)\.lora_(?P<half>[AB])\.weight")
# safetensors dtypes a learner publishes, and how numpy reads each (bf16:
# the high half of an f32, widened below).
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


class UpdateRefused(ProtocolError):
    """An update that does not rebuild into the weights its manifest signs,
    or that declares more than this node allows."""


@dataclass(frozen=True)
class UpdateLimits:
    """What a node allows an update to declare (docs/limits.md, "Updates (node)").

    Real adapters merge with alpha/rank of about 0.5 to 4 (PEFT's default is
    1, the common alpha = 2r is 2; rsLoRA's alpha*sqrt(r) convention gives a
    few more) and hold values well under 1. The defaults sit orders of
    magnitude above that yet keep ``scale * rank * max|B| * max|A|`` (the
    most an adapted weight can move) far below float32's 3.4e38 for any rank
    a matrix of up to 2**16 columns allows: no merge can overflow.
    """

    max_lora_scale: float = setting(
        1e3, "a LoRA update whose alpha/rank exceeds this (or is not finite) is refused", lo=1e-3, hi=1e6
    )
    max_lora_value: float = setting(
        1e4, "a LoRA update holding a value beyond +-this (or NaN/inf) is refused", lo=1.0, hi=1e8
    )
    max_adapter_header_kib: int = setting(
        1024,
        "a LoRA adapter file whose safetensors header is longer is refused (an adapter of every matrix of "
        "an 80-layer model needs about 200 KiB)",
        lo=16,
        hi=100 * 1024,
    )


@dataclass(frozen=True)
class AdapterPair:
    """One adapted matrix: ``lora_A`` is (rank, columns), ``lora_B`` (rows, rank)."""

    prefix: str
    rows: int
    columns: int


@dataclass(frozen=True)
class Adapter:
    """What a checked adapter file declares."""

    rank: int
    alpha: float
    pairs: tuple[AdapterPair, ...]


def check_adapter(adapter: bytes, limits: UpdateLimits) -> Adapter:
    """The rank, alpha and adapted matrices of a LoRA adapter file, once every
    size, scale and value in it is within ``limits``; ``UpdateRefused``
    otherwise. Allocates at most one tensor's values (as float32) beyond the
    header."""
    header, data = _header(adapter, limits.max_adapter_header_kib * 1024)
    rank, alpha = lora_settings(header.pop("__metadata__", None), limits.max_lora_scale)
    halves: dict[str, dict[str, tuple[int, int]]] = {}
    for name, info in header.items():
        match = _HALF.fullmatch(name)
        if match is None:
            raise UpdateRefused(f"adapter tensor {name!r} is not a lora_A or lora_B weight")
        shape = _tensor(name, info, data, limits.max_lora_value)
        halves.setdefault(match["prefix"], {})[match["half"]] = shape
    pairs = []
    for prefix, half in sorted(halves.items()):
        if set(half) != {"A", "B"}:
            raise UpdateRefused(f"adapter tensor {prefix}: lora_A and lora_B must come together")
        (rank_a, columns), (rows, rank_b) = half["A"], half["B"]
        if rank_a != rank or rank_b != rank:
            raise UpdateRefused(f"adapter tensor {prefix}: lora_A {half['A']}, lora_B {half['B']} are not rank {rank}")
        if rank > min(rows, columns):
            # A rank beyond the matrix's smaller side adds nothing a smaller
            # one could not, only memory.
            raise UpdateRefused(f"adapter tensor {prefix}: rank {rank} exceeds its {rows}x{columns} matrix")
        pairs.append(AdapterPair(prefix, rows, columns))
    if not pairs:
        raise UpdateRefused("the adapter file holds no lora_A/lora_B pairs")
    return Adapter(rank, alpha, tuple(pairs))


def lora_settings(meta: object, max_scale: float = math.inf) -> tuple[int, float]:
    """Rank and alpha from an adapter's ``__metadata__``: a positive integer
    rank, a finite alpha with |alpha/rank| at most ``max_scale``."""
    try:
        settings = json.loads(meta["lora"])  # type: ignore[index]
        rank, alpha = settings["rank"], settings["alpha"]
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise UpdateRefused(f"not a LoRA adapter file (no lora metadata: {exc!r})") from None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise UpdateRefused(f"adapter rank {rank!r} (a positive integer)")
    try:
        # JSON integers have no size limit: float() refuses those beyond a double.
        scale = float(alpha) / float(rank) if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else None
    except OverflowError:
        scale = None
    if scale is None or not math.isfinite(float(alpha)):
        raise UpdateRefused(f"adapter alpha {alpha!r:.40} over rank {rank!r:.40} is not a finite number")
    if not abs(scale) <= max_scale:
        raise UpdateRefused(f"adapter alpha/rank = {alpha}/{rank} is beyond +-{max_scale}")
    return rank, float(alpha)


def _header(data: bytes, max_header: int) -> tuple[dict, memoryview]:
    """A safetensors file's JSON header (its length checked before it is read)
    and the data after it."""
    try:
        return read_header(data, max_header)
    except BadHeader as exc:
        raise UpdateRefused(f"the adapter: {exc}") from None


def _tensor(name: str, info: object, data: memoryview, max_value: float) -> tuple[int, int]:
    """A tensor's 2-D shape, once its entry is well-formed, its bytes lie
    inside the file and every value is finite and within +-``max_value``."""
    try:
        kind, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]  # type: ignore[index]
        dtype = _DTYPES[kind]
    except (KeyError, TypeError) as exc:
        raise UpdateRefused(f"adapter tensor {name!r} has a malformed entry ({exc!r})") from None
    if not (_sizes(shape) and _sizes(offsets) and len(offsets) == 2):
        raise UpdateRefused(f"adapter tensor {name!r}: shape {shape!r}, offsets {offsets!r} (lists of sizes)")
    begin, end = offsets
    if len(shape) != 2 or 0 in shape:
        raise UpdateRefused(f"adapter tensor {name!r} has shape {shape}, not a matrix")
    if not begin <= end <= len(data) or end - begin != shape[0] * shape[1] * dtype.itemsize:
        raise UpdateRefused(f"adapter tensor {name!r} ({shape}) does not match bytes {begin}..{end} of {len(data)}")
    values = np.frombuffer(data[begin:end], dtype)
    if kind == "BF16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    # Also false for NaN: one comparison refuses NaN, inf and the huge.
    if not bool((np.abs(values) <= max_value).all()):
        raise UpdateRefused(f"adapter tensor {name!r} holds values that are not finite or beyond +-{max_value}")
    return shape[0], shape[1]


def _sizes(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
