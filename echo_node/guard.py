"""What a node checks in an assignment before it generates anything.

The learner (or whoever forged a job the volunteer joined) decides what a
node is asked to do, and some requests would crash the node or make it
allocate far more than it should: temperature 0 divides the logits by zero,
a prompt token id outside the vocabulary indexes past the embedding table,
a prompt plus its answer longer than the model's context overruns the KV
cache. The codec already bounds every count and size on the wire; this
checks what only the loaded model can tell. A refused assignment costs one
log line; the node stays up and asks again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from protocol.messages import WorkAssignment

# Below this, softmax(logits / T) underflows to a one-hot in float64 for
# ordinary logit gaps: sampling degenerates to argmax and log-probs to
# -inf, which no learner can verify. The learner samples at 1.0.
MIN_TEMPERATURE = 0.05


class Refused(ValueError):
    """An assignment this node will not run; the message says why."""


@dataclass(frozen=True)
class ModelLimits:
    """What the loaded model can take: token ids below ``vocab_size``, at most
    ``context`` tokens of prompt plus answer."""

    vocab_size: int
    context: int

    @classmethod
    def from_config(cls, config_json: str) -> ModelLimits:
        """From the model config a manifest carries (a transformers config)."""
        config = json.loads(config_json)
        return cls(int(config["vocab_size"]), int(config.get("max_position_embeddings", 2048)))


def check_assignment(work: WorkAssignment, limits: ModelLimits) -> None:
    """Raise ``Refused`` unless every part of ``work`` is safe to run on this model."""
    if work.temperature < MIN_TEMPERATURE:
        raise Refused(f"temperature {work.temperature} is below {MIN_TEMPERATURE}")
    for prompt in work.prompts:
        if any(not 0 <= t < limits.vocab_size for t in prompt.tokens):
            raise Refused(f"prompt {prompt.prompt_id} has token ids outside the vocabulary "
                          f"(0..{limits.vocab_size - 1})")
        if len(prompt.tokens) + work.max_new_tokens > limits.context:
            raise Refused(f"prompt {prompt.prompt_id}: {len(prompt.tokens)} tokens plus "
                          f"{work.max_new_tokens} new exceed the model's context of {limits.context}")
    if any(not 0 <= t < limits.vocab_size for t in work.stop_token_ids):
        raise Refused("stop token ids outside the vocabulary")
