"""What a task is: prompts drawn with the learner's seeded RNG, a held-out
split that training never sees, and a reward the learner computes."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TaskPrompt:
    text: str  # what the model is asked (the user's message)
    answer: str  # the expected answer, for rewards and for people reading logs
    # Whatever else the task needs to score a completion (e.g. a
    # reasoning-gym entry's metadata). Stays in the learner.
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)


@runtime_checkable
class Task(Protocol):
    """A task family's instance, made by its factory from a ``--task`` spec.

    ``sample`` must be a function of the RNG's state only (a resumed or
    repeated run with the same seed draws the same prompts) and must never
    return a prompt of ``heldout``. ``reward`` is in [0, 1] and must not
    raise, whatever the completion.
    """

    name: str  # the spec it was made from, e.g. "rg:basic_arithmetic"
    system_prompt: str  # what chat models are told before each prompt ("" for none)
    max_new_tokens: int  # the answer budget, unless --max-new-tokens says otherwise

    def sample(self, rng: random.Random) -> TaskPrompt: ...

    def heldout(self, n: int) -> list[TaskPrompt]: ...

    def reward(self, prompt: TaskPrompt, completion: str) -> float: ...


class TaskError(ValueError):
    """A ``--task`` spec that names no task, or options the task refuses."""


def parse_options(text: str) -> dict[str, Any]:
    """``"min_terms=2,max_terms=3,name=x"`` -> ``{"min_terms": 2, "max_terms": 3, "name": "x"}``.

    Values are read as JSON where they parse (numbers, true/false, null,
    quoted strings) and kept as text otherwise."""
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TaskError(f"task option {item!r} is not key=value")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value.strip()
    return options
