"""The default model and tokenizer, built in code so nothing is downloaded.

A Llama-architecture model (Qwen2's tokenizer class adds a token and breaks
vocab agreement, see ../shared/notes/inference.md) and a byte-level tokenizer:
token id ``b`` is byte ``b``; then pad, bos, eos.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
VOCAB_SIZE = 256 + 3


@dataclass(frozen=True)
class ModelShape:
    # ~0.4 M parameters: a GRPO step on 256 short sequences takes well under a
    # second on 2 CPU cores, and the reverse task is learnable in minutes.
    hidden_size: int = 128
    intermediate_size: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    context: int = 64
    seed: int = 0


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def build_tokenizer() -> PreTrainedTokenizerFast:
    byte_chars = _byte_chars()
    vocab = {byte_chars[b]: b for b in range(256)}
    vocab.update({PAD: 256, BOS: 257, EOS: 258})
    # A BPE model with no merges is a pure byte-level vocabulary.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([PAD, BOS, EOS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS
    )


def tokenizer_digest(tokenizer: PreTrainedTokenizerFast) -> bytes:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).digest()


def model_config(shape: ModelShape) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context,
        pad_token_id=256,
        bos_token_id=257,
        eos_token_id=258,
        tie_word_embeddings=True,
    )


def build_model(shape: ModelShape = ModelShape()) -> LlamaForCausalLM:
    """The same initial weights on every machine: seeded, CPU, float32."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(shape.seed)
        model = LlamaForCausalLM(model_config(shape))
    return model.float()


def config_json(model: LlamaForCausalLM) -> str:
    """The model's config.json as text, for the manifest."""
    return json.dumps(model.config.to_dict(), sort_keys=True)
