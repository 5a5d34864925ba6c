"""A node refuses assignments that would crash it or overrun its model, before generating."""

import dataclasses
import json

import pytest

from echo_node.guard import ModelLimits, Refused, check_assignment
from protocol.messages import Prompt, WorkAssignment

LIMITS = ModelLimits.from_config(json.dumps({"vocab_size": 259, "max_position_embeddings": 64}))
GOOD = WorkAssignment("reverse-test", 3, 1, (Prompt(1, (257, 97, 98, 99, 61)),), 16, 4, 1.0, (258,), 99)


def test_the_learners_ordinary_assignment_passes():
    assert LIMITS == ModelLimits(259, 64)
    check_assignment(GOOD, LIMITS)


@pytest.mark.parametrize("change, why", [
    ({"temperature": 0.0}, "temperature 0.0 is below"),
    ({"temperature": 0.01}, "temperature 0.01 is below"),
    ({"prompts": (Prompt(1, (257, 259)),)}, "outside the vocabulary"),
    ({"prompts": (Prompt(1, (5,)), Prompt(2, (10**6,)))}, "prompt 2 has token ids outside"),
    ({"prompts": (Prompt(1, (97,) * 61),)}, "exceed the model's context of 64"),
    ({"max_new_tokens": 60, "prompts": (Prompt(1, (97,) * 5),)}, "5 tokens plus 60 new"),
    ({"stop_token_ids": (300,)}, "stop token ids outside"),
])
def test_unsafe_assignments_are_refused_with_the_reason(change, why):
    with pytest.raises(Refused, match=why):
        check_assignment(dataclasses.replace(GOOD, **change), LIMITS)
