"""A policy version as a GGUF file that llama.cpp loads, written with the ``gguf``
package (no llama.cpp source tree needed).

The input is what every node receives: the manifest's ``config.json`` text and
the safetensors weights of a model of one of ``protocol.models.families``. Tensor
names come from the ``gguf`` package's own per-architecture maps
(``gguf.get_tensor_name_map``, as llama.cpp's converter uses them); the
family's fixes (``Family.permute_qk``, ``Family.norm_shift``) are applied as
llama.cpp's converter applies them; matrices are stored in the requested
dtype. Norm weights and biases (1-D) stay f32, as llama.cpp expects.

The node never tokenizes text (prompts arrive as token ids), but llama.cpp
refuses a file without a vocabulary. We write a byte-level BPE vocabulary of
the model's size: ids 0-255 are GPT-2's byte characters, the rest are
placeholders. For the built-in model that is its real vocabulary. The
learner's ``export`` of a model that came from a GGUF file copies that file's
tokenizer instead (vocabulary, merges, special tokens, chat template), so the
exported file chats like the original.

Nodes use it for their llama.cpp backend, the learner for ``export``.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from protocol.models.bytevocab import byte_chars
from protocol.models.families import Family, UnsupportedModel, family_of
from protocol.process.files import replacing

if TYPE_CHECKING:
    import gguf  # imported where used: only llama.cpp nodes need it

__all__ = ["GGUF_DTYPES", "UnsupportedModel", "f32_tensors", "write_gguf"]

# The dtypes a node can run (names as rollouts declare them).
GGUF_DTYPES = ("f32", "f16", "q8_0")


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face rotate-half rows -> llama.cpp interleaved rows, per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# safetensors dtypes a weight may travel in, as numpy reads them (bfloat16,
# which numpy lacks, is widened by hand: its bits are float32's upper half).
FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def f32_tensors(weights: bytes) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as float32 arrays, whatever float dtype
    they travelled in. With numpy alone: a llama.cpp node never imports torch
    (torch's CUDA beside llama.cpp's crashed its model load, docs/inference.md)."""
    from safetensors import deserialize

    tensors = {}
    for name, view in deserialize(weights):  # the library checks the header and offsets
        data, dtype = view["data"], view["dtype"]
        if dtype == "BF16":
            array = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype in FLOAT_DTYPES:
            array = np.frombuffer(data, FLOAT_DTYPES[dtype]).astype(np.float32)
        else:
            raise UnsupportedModel(f"{name} is {dtype}: weights travel as F32, F16 or BF16")
        tensors[name] = array.reshape(view["shape"])
    return tensors


class TensorNames:
    """Hugging Face tensor names -> llama.cpp's, for one config."""

    def __init__(self, config: dict, family: Family):
        import gguf

        arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == family.gguf_arch)
        self._map = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])

    def get(self, hf_name: str) -> str | None:
        return self._map.get_name(hf_name, try_suffixes=(".weight", ".bias"))

    def __getitem__(self, hf_name: str) -> str:
        name = self.get(hf_name)
        if name is None:
            raise UnsupportedModel(f"unexpected tensors: {hf_name} has no llama.cpp name")
        return name


def write_gguf(
    config_json: str, tensors: dict[str, np.ndarray], path: Path, dtype: str, tokenizer_from: Path | None = None
) -> None:
    """Write ``tensors`` (Hugging Face names, float32) as a llama.cpp GGUF at
    ``path``, atomically (a crash or a refusal leaves no file under that name),
    with the tokenizer of the GGUF file ``tokenizer_from`` if given."""
    if dtype not in GGUF_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(GGUF_DTYPES)}")
    config = json.loads(config_json)
    family = family_of(config)
    names = TensorNames(config, family)
    unknown = sorted(n for n in tensors if names.get(n) is None)
    if unknown:
        raise UnsupportedModel(f"unexpected tensors: {unknown[:5]}")
    extra = _rope_tensors(config)  # before the writer: a refusal leaves nothing
    with atomic_writer(path, family) as writer:
        _add_hyperparameters(writer, config, family, dtype)
        if tokenizer_from is None:
            _add_vocabulary(writer, config)
        else:
            _copy_tokenizer(writer, tokenizer_from)
        _add_tensors(writer, config, family, names, tensors, dtype)
        for name, data in extra.items():
            writer.add_tensor(name, data)


@contextlib.contextmanager
def atomic_writer(path: Path, family: Family) -> Iterator[gguf.GGUFWriter]:
    """A GGUF writer of ``family``'s architecture for ``path``: what the block
    adds is written, fsynced and renamed into place when it ends; nothing is
    left under ``path`` if it raises."""
    import gguf

    with replacing(path, durable=True) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch=family.gguf_arch)
        try:
            yield writer
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()


def _rope(config: dict, layers: str = "full_attention") -> dict:
    # transformers 5 keeps RoPE settings in rope_parameters (per layer type
    # for models with sliding-window layers, e.g. Gemma 3); older configs
    # have rope_theta (and rope_scaling) at the top level.
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return rope.get(layers, rope) if isinstance(rope.get(layers), dict) else rope


def _rope_tensors(config: dict) -> dict[str, np.ndarray]:
    """Llama 3's RoPE scaling, which llama.cpp reads as per-frequency factors
    (``rope_freqs``), computed as llama.cpp's converter does; nothing for
    plain RoPE; ``UnsupportedModel`` for any other kind."""
    rope = _rope(config)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("default", "linear"):
        return {}
    if kind != "llama3":
        raise UnsupportedModel(f"RoPE type {kind!r} is not supported by the GGUF export (default, linear, llama3)")
    base = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_context = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for i in range(0, dim, 2):
        wavelength = 2 * math.pi * base ** (i / dim)
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return {"rope_freqs.weight": np.array(factors, dtype=np.float32)}


def _add_hyperparameters(writer: gguf.GGUFWriter, config: dict, family: Family, dtype: str) -> None:
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = _rope(config)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    if rope.get("rope_type", rope.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(config["vocab_size"])
    if family.full_attention_every:
        writer.add_sliding_window(int(config["sliding_window"]))
        sliding = _rope(config, "sliding_attention")
        if sliding is not rope:  # its own RoPE base for the sliding-window layers
            writer.add_rope_freq_base_swa(float(sliding.get("rope_theta", 10000.0)))
    for key in family.softcapping:  # family_of checked that each is set
        getattr(writer, f"add_{key}")(float(config[key]))  # add_attn_logit_softcapping, ...
    writer.add_file_type(
        {
            "f32": gguf.LlamaFileType.ALL_F32,
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[dtype]
    )


def _add_vocabulary(writer: gguf.GGUFWriter, config: dict) -> None:
    import gguf

    vocab = config["vocab_size"]
    tokens = list(byte_chars()[: min(vocab, 256)]) + [f"<|tok_{i}|>" for i in range(256, vocab)]
    types = [gguf.TokenType.NORMAL] * vocab
    for key, add in (
        ("pad_token_id", writer.add_pad_token_id),
        ("bos_token_id", writer.add_bos_token_id),
        ("eos_token_id", writer.add_eos_token_id),
    ):
        special = config.get(key)
        if isinstance(special, int) and 0 <= special < vocab:
            types[special] = gguf.TokenType.CONTROL
            add(special)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # llama.cpp refuses a BPE vocabulary without merges; this pair is not in it.
    writer.add_token_merges(["<|tok_merge_a|> <|tok_merge_b|>"])
    writer.add_add_bos_token(False)


def _copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> None:
    import gguf

    for field in gguf.GGUFReader(source).fields.values():
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), vtype, sub_type)


def _add_tensors(
    writer: gguf.GGUFWriter,
    config: dict,
    family: Family,
    names: TensorNames,
    tensors: dict[str, np.ndarray],
    dtype: str,
) -> None:
    import gguf

    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    for hf_name, array in sorted(tensors.items()):
        data = np.ascontiguousarray(array, dtype=np.float32)
        if family.permute_qk and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute(data, heads)
        elif family.permute_qk and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute(data, kv_heads)
        if family.norm_shift and hf_name.endswith("norm.weight"):
            data = data + np.float32(family.norm_shift)
        name = names[hf_name]
        if data.ndim == 1 or dtype == "f32":
            writer.add_tensor(name, data)
        elif dtype == "f16":
            writer.add_tensor(name, data.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
