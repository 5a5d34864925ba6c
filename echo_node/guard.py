"""What a node checks in an assignment before it generates anything.

The learner (or whoever forged a job the volunteer joined) decides what a
node is asked to do, and some requests would crash the node or make it
allocate far more than it should: temperature 0 divides the logits by zero,
a prompt token id outside the vocabulary indexes past the embedding table,
a prompt plus its answer longer than the model's context overruns the KV
cache. The codec already bounds every count and size on the wire; this
checks what only the loaded model can tell. A refused assignment costs one
log line; the node stays up and asks again.

A version's weights and config are checked the same way before anything is
built from them (``check_version``): a safetensors header that is malformed or
points outside the file, or a config that describes a bigger model than the
weights hold (transformers allocates the config's model before it loads a
single weight), is refused. Whether the model fits in memory is
``echo_node.memory``'s question.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from echo_node.model_shape import DEFAULT_CONTEXT, ModelShape, model_shape
from echo_node.refusals import Refused
from protocol.models.families import context_length
from protocol.models.safetensors_header import BadHeader, read_header
from protocol.wire.work import WorkAssignment

# Below this, softmax(logits / T) underflows to a one-hot in float64 for
# ordinary logit gaps: sampling degenerates to argmax and log-probs to
# -inf, which no learner can verify. The learner samples at 1.0.
MIN_TEMPERATURE = 0.05


@dataclass(frozen=True)
class ModelLimits:
    """What the loaded model can take: token ids below ``vocab_size``, at most
    ``context`` tokens of prompt plus answer."""

    vocab_size: int
    context: int
    context_is: str = "the model's context"  # what sets it, for people

    @classmethod
    def from_config(cls, config_json: str) -> ModelLimits:
        """From the model config a manifest carries (a transformers config)."""
        config = json.loads(config_json)
        context = context_length(config, DEFAULT_CONTEXT)
        if context < int(config.get("max_position_embeddings") or DEFAULT_CONTEXT):
            # llama.cpp attends past this family's window where transformers does not.
            return cls(int(config["vocab_size"]), context, f"{config['model_type']}'s sliding window")
        return cls(int(config["vocab_size"]), context)


def check_assignment(work: WorkAssignment, limits: ModelLimits) -> None:
    """Raise ``Refused`` unless every part of ``work`` is safe to run on this model."""
    if work.temperature < MIN_TEMPERATURE:
        raise Refused(f"temperature {work.temperature} is below {MIN_TEMPERATURE}")
    for prompt in work.prompts:
        if any(not 0 <= t < limits.vocab_size for t in prompt.tokens):
            raise Refused(
                f"prompt {prompt.prompt_id} has token ids outside the vocabulary (0..{limits.vocab_size - 1})"
            )
        if len(prompt.tokens) + work.max_new_tokens > limits.context:
            raise Refused(
                f"prompt {prompt.prompt_id}: {len(prompt.tokens)} tokens plus "
                f"{work.max_new_tokens} new exceed {limits.context_is} of {limits.context}"
            )
    if any(not 0 <= t < limits.vocab_size for t in work.stop_token_ids):
        raise Refused("stop token ids outside the vocabulary")


# --- a version's weights and config --------------------------------------------

# The safetensors library accepts headers up to 100 MB; a Llama's header is a
# few hundred bytes per tensor.
MAX_HEADER_BYTES = 16 * 2**20
MAX_TENSORS = 65536
ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2}  # what a learner publishes


def weight_elements(weights: bytes) -> int:
    """How many numbers a safetensors file holds, after checking its header:
    bounded, JSON, known float dtypes, shapes that match their byte ranges,
    and ranges inside the file. Raises ``Refused``."""
    try:
        header, data = read_header(weights, MAX_HEADER_BYTES)
    except BadHeader as exc:
        raise Refused(f"weights: {exc}") from None
    if len(header) > MAX_TENSORS:
        raise Refused(f"weights: the safetensors header is not a table of at most {MAX_TENSORS} tensors")
    data_bytes = len(data)
    elements = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            size = ITEM_BYTES[dtype]
            count = math.prod(shape)
            if not all(isinstance(x, int) and x >= 0 for x in (*shape, begin, end)):
                raise ValueError("negative or non-integer sizes")
        except (KeyError, TypeError, ValueError) as exc:
            raise Refused(f"weights: tensor {name!r} has a malformed entry ({exc!r})") from None
        if not begin <= end <= data_bytes or end - begin != count * size:
            raise Refused(
                f"weights: tensor {name!r} ({dtype} {shape}) does not match bytes {begin}..{end} of {data_bytes}"
            )
        elements += count
    return elements


def check_version(config_json: str, weights: bytes) -> ModelShape:
    """Raise ``Refused`` unless a model built from ``config_json`` holds no more
    than ``weights`` carry; its shape otherwise (whether it fits in memory is
    ``echo_node.memory``'s question)."""
    held = weight_elements(weights)
    shape = model_shape(config_json)
    # Biases and rounding aside, the config describes exactly what the
    # weights hold; a few percent of slack, never a bigger model.
    if shape.parameters > held * 1.05 + 4096:
        raise Refused(f"model config describes {shape.parameters:,} parameters but the weights hold {held:,}")
    return shape
