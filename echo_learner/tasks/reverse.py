"""The toy task of the built-in byte-level model: reverse a short string."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from functools import cached_property

from echo_learner.tasks.base import TaskError, TaskPrompt, parse_options


@dataclass(frozen=True)
class ReverseTask:
    """Reverse a short string: ``"abc="`` -> ``"cba"``.

    Reward is the fraction of answer positions that are right, divided by the
    longer of answer and completion so that rambling is penalised. From a
    random model it rises from ~0 to >0.7 in a few minutes of GRPO on 2 cores.
    Every ``heldout_every``-th string (in sorted order) is held out.
    """

    name: str = "reverse"
    alphabet: str = "abcd"
    length: int = 3
    heldout_every: int = 8
    system_prompt: str = ""

    @property
    def max_new_tokens(self) -> int:
        return self.length + 1  # the reversed string and eos

    @cached_property
    def _heldout(self) -> frozenset[str]:
        every = sorted("".join(t) for t in itertools.product(self.alphabet, repeat=self.length))
        return frozenset(every[:: self.heldout_every])

    def sample(self, rng: random.Random) -> TaskPrompt:
        while True:
            s = "".join(rng.choice(self.alphabet) for _ in range(self.length))
            if s not in self._heldout:
                return TaskPrompt(text=f"{s}=", answer=s[::-1])

    def heldout(self, n: int) -> list[TaskPrompt]:
        return [TaskPrompt(text=f"{s}=", answer=s[::-1]) for s in sorted(self._heldout)[:n]]

    def reward(self, prompt: TaskPrompt, completion: str) -> float:
        hits = sum(a == b for a, b in zip(completion, prompt.answer))
        return hits / max(len(prompt.answer), len(completion), 1)


def make(arg: str) -> ReverseTask:
    """``reverse`` or ``reverse:alphabet=abc,length=4``."""
    options = parse_options(arg)
    unknown = set(options) - {"alphabet", "length"}
    if unknown:
        raise TaskError(f"reverse has no option {', '.join(sorted(unknown))} (it has: alphabet, length)")
    task = ReverseTask(name="reverse" + (f":{arg}" if arg else ""), **options)
    if not (isinstance(task.alphabet, str) and len(set(task.alphabet)) >= 2):
        raise TaskError("reverse: alphabet must be at least 2 distinct characters")
    if not (isinstance(task.length, int) and 1 <= task.length <= 16):
        raise TaskError("reverse: length must be 1 to 16")
    return task
