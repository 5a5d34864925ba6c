"""A node refuses assignments that would crash it or overrun its model, before generating."""

import dataclasses
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_node.guard import ModelLimits, check_assignment, check_version, weight_elements
from echo_node.model_shape import model_shape
from echo_node.refusals import Refused
from protocol.wire.work import Prompt, WorkAssignment

LIMITS = ModelLimits.from_config(json.dumps({"vocab_size": 259, "max_position_embeddings": 64}))
GOOD = WorkAssignment("reverse-test", 3, 1, (Prompt(1, (257, 97, 98, 99, 61)),), 16, 4, 1.0, (258,), 99)


def test_the_learners_ordinary_assignment_passes():
    assert LIMITS == ModelLimits(259, 64)
    check_assignment(GOOD, LIMITS)


@pytest.mark.parametrize(
    "change, why",
    [
        ({"temperature": 0.0}, "temperature 0.0 is below"),
        ({"temperature": 0.01}, "temperature 0.01 is below"),
        ({"prompts": (Prompt(1, (257, 259)),)}, "outside the vocabulary"),
        ({"prompts": (Prompt(1, (5,)), Prompt(2, (10**6,)))}, "prompt 2 has token ids outside"),
        ({"prompts": (Prompt(1, (97,) * 61),)}, "exceed the model's context of 64"),
        ({"max_new_tokens": 60, "prompts": (Prompt(1, (97,) * 5),)}, "5 tokens plus 60 new"),
        ({"stop_token_ids": (300,)}, "stop token ids outside"),
    ],
)
def test_unsafe_assignments_are_refused_with_the_reason(change, why):
    with pytest.raises(Refused, match=why):
        check_assignment(dataclasses.replace(GOOD, **change), LIMITS)


# --- a version's weights and config: the learner's real default model ----------


def published_version():
    """The built-in model's config and safetensors bytes, as a learner publishes them."""
    from safetensors.torch import save

    from echo_learner.training.model import build_model, config_json

    model = build_model()
    tied = model.config.tie_word_embeddings
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    return config_json(model), save(state), sum(p.numel() for p in model.parameters())


CONFIG, WEIGHTS, PARAMS = published_version()


def test_the_published_model_passes_and_config_and_weights_agree():
    assert weight_elements(WEIGHTS) == model_shape(CONFIG).parameters == PARAMS
    assert check_version(CONFIG, WEIGHTS) == model_shape(CONFIG)


def _with_config(**change):
    return json.dumps({**json.loads(CONFIG), **change})


@pytest.mark.parametrize(
    "change, why",
    [
        ({"num_hidden_layers": 400}, "describes .* parameters but the weights hold"),
        ({"hidden_size": 4096, "intermediate_size": 11008}, "describes .* parameters but the weights hold"),
        ({"vocab_size": 10**9}, r"vocab_size = 1000000000 \(an integer in"),
        ({"num_attention_heads": 0}, "num_attention_heads = 0"),
        ({"intermediate_size": "big"}, "intermediate_size = 'big'"),
    ],
)
def test_a_config_bigger_than_its_weights_is_refused_before_anything_is_built(change, why):
    with pytest.raises(Refused, match=why):
        check_version(_with_config(**change), WEIGHTS)


def _with_header(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


@pytest.mark.parametrize(
    "weights, why",
    [
        (b"\x01\x02", "shorter than a safetensors header"),
        (struct.pack("<Q", 2**62) + b"{}", "header of 4611686018427387904 bytes"),
        (_with_header(b"{not json"), "not JSON"),
        # Deep enough to exhaust json's recursion: refused, not a crash (the
        # same reader as an update's limits, protocol/models/safetensors_header.py).
        (_with_header(b"[" * 200_000 + b"]" * 200_000), "not JSON .RecursionError"),
        (_with_header(b"[1, 2]"), "not a table"),
        (
            _with_header(b'{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', b"\0" * 8),
            "does not match bytes 0..16 of 8",
        ),
        (_with_header(b'{"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}', b"\0" * 16), "does not match"),
        (_with_header(b'{"t": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}', b"\0" * 16), "malformed entry"),
        (
            _with_header(b'{"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}', b"\0" * 16),
            "malformed entry",
        ),
        (_with_header(b'{"t": [1]}', b"\0" * 16), "malformed entry"),
    ],
)
def test_malformed_safetensors_headers_are_refused(weights, why):
    with pytest.raises(Refused, match=why):
        weight_elements(weights)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_corrupted_header_is_refused_or_still_describes_the_weights(data):
    """Flip bytes anywhere in the header: the check refuses or counts, never crashes."""
    n = struct.unpack("<Q", WEIGHTS[:8])[0]
    raw = bytearray(WEIGHTS[: 8 + n + 64])  # the header and a little data: enough to corrupt
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, 8 + n - 1))] = data.draw(st.integers(0, 255))
    weights = bytes(raw) + WEIGHTS[8 + n + 64 :]
    try:
        elements = weight_elements(weights)
    except Refused:
        return
    assert elements <= len(weights)  # a header that passes never claims more than the file holds


def test_a_node_refuses_to_build_a_forged_version_and_keeps_working(tmp_path):
    """Weights._prepare, with the real torch backend: checks first, and a load
    failure becomes one refusal, not a crash."""
    from echo_node.backend_torch import TorchBackend
    from echo_node.config import NodeConfig
    from echo_node.node import Node
    from tests.protocol.samples import NODE

    node = Node(NodeConfig(data_dir=tmp_path), NODE, TorchBackend(threads=1))
    assert node.weights._prepare(CONFIG, WEIGHTS) is not None
    with pytest.raises(Refused, match="describes .* parameters"):
        node.weights._prepare(_with_config(num_hidden_layers=1000), WEIGHTS)
    renamed = WEIGHTS.replace(b"model.norm.weight", b"model.norm.wEight", 1)  # same sizes, unknown name
    with pytest.raises(Refused, match="could not load the weights"):
        node.weights._prepare(CONFIG, renamed)
