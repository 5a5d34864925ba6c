"""A PEFT LoRA adapter as a llama.cpp GGUF adapter file, written with the
``gguf`` package (no llama.cpp source tree needed).

Why: a llama.cpp node that already holds the base model as a GGUF can take a
new policy version that is only a LoRA adapter by loading this small file
(``llama_adapter_lora_init`` + ``llama_set_adapters_lora``) instead of merging
the adapter into the full weights and exporting and loading a whole new GGUF.
``bench/lora_gguf.py`` measures both.

The file is what llama.cpp's own ``convert_lora_to_gguf.py`` writes:
``general.type = "adapter"``, ``adapter.type = "lora"``,
``adapter.lora.alpha``, and for each adapted matrix two tensors named after
llama.cpp's base tensor, e.g. ``blk.3.attn_q.weight.lora_a`` (r x in) and
``blk.3.attn_q.weight.lora_b`` (out x r). llama.cpp adds
``scale * (alpha / r) * B @ (A @ x)`` to the base matrix's output, as PEFT does
with ``lora_alpha / r`` (for ``use_rslora`` pass ``lora_alpha * sqrt(r)``).

For the families whose q and k projections ``protocol.models.gguf_export`` permutes
from Hugging Face's rotate-half layout to llama.cpp's interleaved one
(``Family.permute_qk``: llama, mistral), the rows of
``W + B @ A`` are the rows of ``W`` plus the rows of ``B``, so ``lora_b`` of q
and k gets the same row permutation and ``lora_a`` (whose rows are the rank)
none.

An adapter reaches this after ``protocol.models.update_limits.check_adapter``; what
does not depend on the node's limits is checked again here, as the file is
written for llama.cpp, which loads whatever numbers it is given:
alpha and every value finite, and a rank no larger than its matrix's
smaller side (``UpdateRefused``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from protocol.models.families import UnsupportedModel, family_of
from protocol.models.gguf_export import TensorNames, atomic_writer, permute
from protocol.models.update_limits import UpdateRefused

# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
#   -> model.layers.3.self_attn.q_proj, "A"
_PEFT_NAME = re.compile(r"base_model\.model\.(?P<base>.+)\.lora_(?P<half>[AB])(?:\.default)?\.weight")


def write_lora_gguf(config_json: str, adapter: dict[str, Any], alpha: float, path: Path | str) -> None:
    """Write ``adapter`` (tensors named as PEFT saves them, numpy arrays or
    torch tensors) as a llama.cpp LoRA adapter at ``path``, atomically, for the
    base model of ``config_json`` exported by ``protocol.models.gguf_export``."""
    import gguf

    if not math.isfinite(alpha):
        raise UpdateRefused(f"adapter alpha {alpha} is not finite")
    config = json.loads(config_json)
    family = family_of(config)
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    names = TensorNames(config, family)

    pairs: dict[str, dict[str, np.ndarray]] = {}  # base HF name -> {"A": ..., "B": ...}
    for peft_name, tensor in adapter.items():
        match = _PEFT_NAME.fullmatch(peft_name)
        base = match["base"] + ".weight" if match else ""
        gguf_name = names.get(base) if base else None
        if gguf_name is None or gguf_name.endswith("norm.weight"):
            raise UnsupportedModel(f"not a LoRA tensor of a {family.model_type} matrix: {peft_name}")
        array = _as_f32(tensor)
        if not np.isfinite(array).all():
            raise UpdateRefused(f"adapter tensor {peft_name} holds values that are not finite")
        pairs.setdefault(base, {})[match["half"]] = array

    with atomic_writer(Path(path), family) as writer:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        for base, halves in sorted(pairs.items()):
            if set(halves) != {"A", "B"}:
                raise UnsupportedModel(f"{base}: lora_A and lora_B must come together")
            a, b = halves["A"], halves["B"]
            if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
                raise UnsupportedModel(f"{base}: lora_A {a.shape} and lora_B {b.shape} do not fit")
            if a.shape[0] > min(a.shape[1], b.shape[0]):
                raise UpdateRefused(f"{base}: rank {a.shape[0]} exceeds its {b.shape[0]}x{a.shape[1]} matrix")
            if family.permute_qk and base.endswith("q_proj.weight"):
                b = permute(b, heads)
            elif family.permute_qk and base.endswith("k_proj.weight"):
                b = permute(b, kv_heads)
            writer.add_tensor(names[base] + ".lora_a", np.ascontiguousarray(a))
            writer.add_tensor(names[base] + ".lora_b", np.ascontiguousarray(b))


def _as_f32(tensor: Any) -> np.ndarray:
    if hasattr(tensor, "detach"):  # a torch tensor, without importing torch
        tensor = tensor.detach().float().cpu().numpy()
    return np.asarray(tensor, dtype=np.float32)
