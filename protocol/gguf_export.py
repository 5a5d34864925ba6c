"""A policy version as a GGUF file that llama.cpp loads, written with the ``gguf``
package (no llama.cpp source tree needed).

The input is what every node receives: the manifest's ``config.json`` text and
the safetensors weights of a Llama-architecture model. The tensors are renamed
to llama.cpp's names, the q/k projections are permuted from Hugging Face's
rotate-half layout to llama.cpp's interleaved one (as llama.cpp's own
``convert_hf_to_gguf.py`` does), and matrices are stored in the requested dtype.
Norm weights (1-D) stay f32, as llama.cpp expects.

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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from protocol.bytevocab import byte_chars
from protocol.files import replacing

if TYPE_CHECKING:
    import gguf  # imported where used: only llama.cpp nodes need it

# The dtypes a node can run (names as rollouts declare them).
GGUF_DTYPES = ("f32", "f16", "q8_0")


class UnsupportedModel(ValueError):
    """The weights are not a Llama-architecture model this exporter knows."""


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face rotate-half rows -> llama.cpp interleaved rows, per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor_names(layers: int) -> dict[str, str]:
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        names.update(
            {
                hf + "input_layernorm.weight": gg + "attn_norm.weight",
                hf + "self_attn.q_proj.weight": gg + "attn_q.weight",
                hf + "self_attn.k_proj.weight": gg + "attn_k.weight",
                hf + "self_attn.v_proj.weight": gg + "attn_v.weight",
                hf + "self_attn.o_proj.weight": gg + "attn_output.weight",
                hf + "post_attention_layernorm.weight": gg + "ffn_norm.weight",
                hf + "mlp.gate_proj.weight": gg + "ffn_gate.weight",
                hf + "mlp.up_proj.weight": gg + "ffn_up.weight",
                hf + "mlp.down_proj.weight": gg + "ffn_down.weight",
            }
        )
    return names


def write_gguf(
    config_json: str, tensors: dict[str, np.ndarray], path: Path, dtype: str, tokenizer_from: Path | None = None
) -> None:
    """Write ``tensors`` (Hugging Face names, float32) as a llama.cpp GGUF at
    ``path``, atomically (a crash or a refusal leaves no file under that name),
    with the tokenizer of the GGUF file ``tokenizer_from`` if given."""
    if dtype not in GGUF_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(GGUF_DTYPES)}")
    config = json.loads(config_json)
    if config.get("model_type") != "llama":
        raise UnsupportedModel(f"llama.cpp export supports the llama architecture, not {config.get('model_type')!r}")
    unknown = set(tensors) - set(_tensor_names(config["num_hidden_layers"]))
    if unknown:
        raise UnsupportedModel(f"unexpected tensors: {sorted(unknown)[:5]}")
    with atomic_writer(path) as writer:
        _add_hyperparameters(writer, config, dtype)
        if tokenizer_from is None:
            _add_vocabulary(writer, config)
        else:
            _copy_tokenizer(writer, tokenizer_from)
        _add_tensors(writer, config, tensors, dtype)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[gguf.GGUFWriter]:
    """A llama-architecture GGUF writer for ``path``: what the block adds is
    written, fsynced and renamed into place when it ends; nothing is left
    under ``path`` if it raises."""
    import gguf

    with replacing(path, durable=True) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch="llama")
        try:
            yield writer
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()


def _add_hyperparameters(writer: gguf.GGUFWriter, config: dict, dtype: str) -> None:
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    # transformers 5 keeps RoPE settings in rope_parameters; older configs
    # have rope_theta (and rope_scaling) at the top level.
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise UnsupportedModel(f"RoPE type {rope.get('rope_type')!r} is not supported by the GGUF export")
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
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(config["vocab_size"])
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


def _add_tensors(writer: gguf.GGUFWriter, config: dict, tensors: dict[str, np.ndarray], dtype: str) -> None:
    import gguf

    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    names = _tensor_names(config["num_hidden_layers"])
    for hf_name, array in sorted(tensors.items()):
        data = np.ascontiguousarray(array, dtype=np.float32)
        if hf_name.endswith("q_proj.weight"):
            data = _permute(data, heads)
        elif hf_name.endswith("k_proj.weight"):
            data = _permute(data, kv_heads)
        name = names[hf_name]
        if data.ndim == 1 or dtype == "f32":
            writer.add_tensor(name, data)
        elif dtype == "f16":
            writer.add_tensor(name, data.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
