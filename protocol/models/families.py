"""The model families Echo Swarm trains, and the little that differs between them.

Most of what a family is comes from its libraries: transformers builds it from
its ``config.json`` (Auto classes), the ``gguf`` package names its tensors for
llama.cpp (``gguf.get_tensor_name_map``), PEFT wraps its linear layers. What is
left is this table: the fixes llama.cpp's own converter makes per family
(``conversion/llama.py``, ``qwen.py``, ``gemma.py`` in its source), and the
attention layout llama.cpp assumes for it, which a config must match.

The learner refuses a model whose family is not here before it writes
anything; a node refuses such a job's versions in one line.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnsupportedModel(ValueError):
    """A model (config or weights) that no family here describes."""


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' config.model_type
    gguf_arch: str  # llama.cpp's architecture name (gguf.MODEL_ARCH_NAMES)
    # llama.cpp's llama graph wants the q and k rows of each head interleaved
    # (its RoPE pairs neighbours); Hugging Face stores them rotate-half.
    permute_qk: bool = False
    # RMSNorm computes x * (1 + w) in transformers; llama.cpp stores 1 + w.
    norm_shift: float = 0.0
    # llama.cpp hard-codes the sliding-window layout: every n-th layer
    # (counting from 1) attends fully, the others within ``sliding_window``.
    full_attention_every: int = 0
    # Config keys of the tanh caps on logits llama.cpp applies to this family
    # whatever the file says (Gemma 2: attention and final); a config must set
    # them. Other families must not set any.
    softcapping: tuple[str, ...] = ()
    # llama.cpp ignores this family's ``sliding_window``: sequences must stay
    # within it, where full attention computes the same.
    window_caps_context: bool = False


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "llama", permute_qk=True),
        # llama.cpp runs Mistral as a llama (conversion/__init__.py).
        Family("mistral", "llama", permute_qk=True, window_caps_context=True),
        Family("qwen2", "qwen2"),
        Family("qwen3", "qwen3"),
        Family(
            "gemma2",
            "gemma2",
            norm_shift=1.0,
            full_attention_every=2,
            softcapping=("attn_logit_softcapping", "final_logit_softcapping"),
        ),
        # Gemma3ForCausalLM: the text models (1B; 4B and 12B's language models;
        # 27B scales its queries otherwise and is refused).
        Family("gemma3_text", "gemma3", norm_shift=1.0, full_attention_every=6),
    )
}


def family_of(config: dict) -> Family:
    """The family of a transformers config (as a dict); ``UnsupportedModel``,
    naming the families we support, for any other."""
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise UnsupportedModel(f"model architecture {model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    _check_config(family, config)
    return family


def _check_config(family: Family, config: dict) -> None:
    """Refuse a config that llama.cpp would compute differently: the layout
    of sliding-window layers, the query scale, the logit caps."""
    layer_types = config.get("layer_types")
    if family.full_attention_every and layer_types:
        expected = [
            "full_attention" if (i + 1) % family.full_attention_every == 0 else "sliding_attention"
            for i in range(len(layer_types))
        ]
        if list(layer_types) != expected:
            raise UnsupportedModel(f"{family.model_type}: layer_types {layer_types} differ from llama.cpp's layout")
    elif layer_types and any(t != "full_attention" for t in layer_types):
        raise UnsupportedModel(f"{family.model_type}: sliding-window layers are not supported for this family")
    head_dim = config.get("head_dim")
    if config.get("query_pre_attn_scalar", head_dim) != head_dim:
        raise UnsupportedModel(f"{family.model_type}: llama.cpp scales queries by head_dim, not query_pre_attn_scalar")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if key in family.softcapping and config.get(key) is None:
            raise UnsupportedModel(f"{family.model_type}: {key} must be set (llama.cpp applies it)")
        if key not in family.softcapping and config.get(key) is not None:
            raise UnsupportedModel(f"{family.model_type}: {key} is not supported for this family")


def context_length(config: dict, default: int) -> int:
    """The longest prompt plus answer a node runs: the model's context, or
    its sliding window where llama.cpp ignores that (``window_caps_context``)."""
    context = int(config.get("max_position_embeddings") or default)
    family = FAMILIES.get(str(config.get("model_type")))
    window = config.get("sliding_window")
    if family is not None and family.window_caps_context and isinstance(window, int) and window > 0:
        context = min(context, window)
    return context


def wire_dtype(config: dict) -> str:
    """The dtype a model's weights travel in: its own half precision when it
    has one (``bf16``, ``f16``), else ``f32``."""
    own = config.get("dtype") or config.get("torch_dtype")
    return {"bfloat16": "bf16", "float16": "f16"}.get(str(own).removeprefix("torch."), "f32")
