"""Math problems whose answers are checked with math-verify: ``math:<dataset>``.

The problems come from one of reasoning-gym's math generators (default
``basic_arithmetic``; any ``rg`` dataset with a numeric or symbolic answer
works, with the same options); the answer in the last ``<answer>`` block, or
without one the final answer math-verify finds in the text itself, is compared
with the expected one symbolically, so ``0.5``, ``1/2`` and ``\\frac{1}{2}``
all count. Reward: 0.9 for a correct answer plus 0.1 for exactly one answer
block. Small models rarely use the block at first: SmolLM2-135M-Instruct never
did in 240 answers, yet "4 + 3 = 7" solved a third of two-term one-digit sums;
scoring the free text gives GRPO that signal, and the format bonus then teaches
the block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from echo_learner.tasks import rg
from echo_learner.tasks.base import TaskError, TaskPrompt

# math-verify warns on every call made without its SIGALRM timeouts, which
# only the main thread may use (held-out evaluation runs in a worker thread).
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _math_verify():  # type: ignore[no-untyped-def]
    try:
        import math_verify
    except ImportError:
        raise TaskError("math: tasks need math-verify: pip install 'echo-swarm[tasks]'") from None
    return math_verify


def equivalent(expected: str, given: str) -> bool:
    """Does ``given`` state the same value as ``expected`` (math-verify)?"""
    mv = _math_verify()
    try:
        # No timeouts: math-verify's use SIGALRM, which only the main thread
        # may set, and the inputs here are short answer blocks.
        gold = mv.parse(expected, parsing_timeout=None)
        answer = mv.parse(given, parsing_timeout=None)
        return bool(gold and answer and mv.verify(gold, answer, timeout_seconds=None))
    except Exception:  # odd text must cost its author the reward, not the learner its loop
        return False


@dataclass
class MathTask(rg.ReasoningGymTask):
    def reward(self, prompt: TaskPrompt, completion: str) -> float:
        blocks = rg.answer_blocks(completion)
        correct = equivalent(prompt.answer, blocks[-1] if blocks else completion)
        return (1 - rg.FORMAT_WEIGHT) * correct + rg.FORMAT_WEIGHT * (len(blocks) == 1)


def make(arg: str) -> MathTask:
    """``math`` (basic_arithmetic) or ``math:<dataset>[:option=value,...]``."""
    _math_verify()
    source = rg.make(arg or "basic_arithmetic")
    return MathTask(
        name=f"math:{arg or 'basic_arithmetic'}", dataset=source.dataset, heldout_dataset=source.heldout_dataset
    )
