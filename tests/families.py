"""Tiny random models of every family we support, built in code (nothing can
be downloaded here), saved as Hugging Face directories the learner loads with
``--model DIR``: the built-in byte tokenizer, each family's own architecture
and quirks (biases, q/k norms, untied embeddings, softcapping, Llama 3 RoPE
scaling), in float32 or bfloat16."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from echo_learner.training.model import VOCAB_SIZE, build_tokenizer

COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    pad_token_id=256,
    bos_token_id=257,
    eos_token_id=258,
)

# What each family's real models have that the others do not.
FAMILY_CONFIGS = {
    "llama": dict(
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        ),
    ),
    # q/k/v biases: the architecture's own. transformers gives a qwen2
    # directory Qwen's tokenizer class, which adds <|endoftext|> as id 259.
    "qwen2": dict(tie_word_embeddings=True, vocab_size=VOCAB_SIZE + 1),
    "qwen3": dict(tie_word_embeddings=True, head_dim=32),  # q/k norms; head_dim * heads != hidden
    "mistral": dict(tie_word_embeddings=False, sliding_window=None),
    # Softcapping, sandwich norms, x * (1 + w); a sliding window shorter than
    # the tests' sequences, so that llama.cpp's must match.
    "gemma2": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8),
    # q/k norms, a RoPE base per layer type; 6 layers: llama.cpp's 5 sliding + 1 full.
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, num_hidden_layers=6, sliding_window=8),
}
FAMILIES = tuple(FAMILY_CONFIGS)
# A random init's next-token distributions are nearly uniform, which would
# hide a wrong tensor layout. Matrices x4 make the layers matter; the final
# norm sets how sharp the logits are: a mean surprise of ~2.5-3 nats, like a
# real model's on its own samples. (Scaling every matrix instead makes
# activations huge and half-precision errors far larger than a real model's.)
MATRIX_SCALE = 4.0
FINAL_NORM = {"gemma2": 3.0, "gemma3_text": 4.0}  # Gemma also scales its embeddings by sqrt(hidden)


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32, **settings):
    """A tiny random model of ``family``, its float32 weights rounded to
    ``dtype``; ``settings`` override its config's."""
    config = AutoConfig.for_model(family, **{**COMMON, **FAMILY_CONFIGS[family], **settings})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name == "model.norm.weight":
                    # Gemma's RMSNorm multiplies by 1 + w.
                    p.fill_(FINAL_NORM.get(family, 5.0) - family.startswith("gemma"))
                elif "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
                elif p.ndim == 1:  # biases
                    p.normal_(0, 0.5)
                else:
                    p.mul_(MATRIX_SCALE)
    model.config.dtype = dtype
    return model.to(dtype).eval()


def save_tiny_model(family: str, directory: Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """``tiny_model`` and the byte tokenizer as a Hugging Face directory."""
    tiny_model(family, seed, dtype).save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return directory


def randomize_adapter(policy: torch.nn.Module, scale: float, seed: int) -> None:
    """Give a freshly wrapped PEFT model's adapters (B starts at zero: no
    effect) seeded random values of standard deviation ``scale``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(scale * torch.randn(p.shape, generator=generator))
