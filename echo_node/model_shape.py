"""The shape of a model built from a job's config: the sizes that memory and
compute depend on, every one bounded before anything is allocated (what a
version's weights must hold is ``echo_node.guard``'s check)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from echo_node.refusals import Refused
from protocol.models.families import UnsupportedModel, family_of, wire_dtype

# A transformers config without max_position_embeddings gets this.
DEFAULT_CONTEXT = 2048
# Config fields that size the model, each bounded well beyond any model a
# volunteer runs (a 70B Llama has hidden 8192, 80 layers, vocab 128k).
CONFIG_BOUNDS = {
    "vocab_size": 2**20,
    "hidden_size": 2**16,
    "intermediate_size": 2**18,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "max_position_embeddings": 2**20,
}


def _config_int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    bound = CONFIG_BOUNDS.get(key, CONFIG_BOUNDS["hidden_size"])
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= bound:
        raise Refused(f"model config: {key} = {value!r} (an integer in 1..{bound})")
    return value


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a model that memory and compute depend on."""

    parameters: int
    vocab: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    wire_bytes: int = 4  # a published weight's bytes: the model's own dtype (protocol.models.families.wire_dtype)


def model_shape(config_json: str) -> ModelShape:
    """The shape of a model (of a family we support) built from
    ``config_json``, every size bounded. Raises ``Refused``."""
    try:
        config = json.loads(config_json)
    except ValueError as exc:
        raise Refused(f"model config is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise Refused("model config is not a JSON object")
    try:
        family_of(config)
    except UnsupportedModel as exc:
        raise Refused(f"model config: {exc}") from None
    vocab, hidden = _config_int(config, "vocab_size"), _config_int(config, "hidden_size")
    inter, layers = _config_int(config, "intermediate_size"), _config_int(config, "num_hidden_layers")
    heads = _config_int(config, "num_attention_heads")
    kv_heads = _config_int(config, "num_key_value_heads", heads)
    head_dim = _config_int(config, "head_dim", max(hidden // heads, 1))
    context = _config_int(config, "max_position_embeddings", DEFAULT_CONTEXT)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, k, v, o
    per_layer = attention + 3 * hidden * inter + 2 * hidden  # + gate, up, down and two norms
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return ModelShape(
        parameters=embeddings + layers * per_layer + hidden,
        vocab=vocab,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        context=context,
        wire_bytes=4 if wire_dtype(config) == "f32" else 2,
    )
