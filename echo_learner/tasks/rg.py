"""Any procedural task of reasoning-gym: ``rg:<dataset>[:option=value,...]``.

reasoning-gym generates each problem from a seed and scores answers itself.
The model is asked to put its final answer between ``<answer>`` and
``</answer>``; the reward is

    0.9 * reasoning-gym's score of the last answer block (0 without one)
    + 0.1 * format (1 if the completion has exactly one answer block)

so a model first learns the format, then the answers. Training problems come
from the learner's seeded RNG; the held-out split is a separate seed space,
and a training problem whose question equals a held-out one is drawn again.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from echo_learner.tasks.base import TaskError, TaskPrompt, parse_options

INSTRUCTION = "Give only the final answer between <answer> and </answer>."
FORMAT_WEIGHT = 0.1
# Problem i of the held-out split is item i of a dataset with this seed;
# training draws items of seed 0 at indices below it, so the two never share
# a generator state. The first MAX_HELDOUT held-out questions are kept out of
# training even where the generator repeats itself.
HELDOUT_SEED = 2**40
MAX_HELDOUT = 500


def _reasoning_gym():  # type: ignore[no-untyped-def]
    try:
        import reasoning_gym
    except ImportError:
        raise TaskError("rg: tasks need reasoning-gym: pip install 'echo-swarm[tasks]'") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    return sorted(_reasoning_gym().factory.DATASETS)


def answer_blocks(completion: str) -> list[str]:
    """The text of each ``<answer>...</answer>`` block, in order."""
    return [m.strip() for m in re.findall(r"<answer>(.*?)</answer>", completion, flags=re.DOTALL)]


@dataclass
class ReasoningGymTask:
    name: str
    dataset: Any  # a reasoning_gym ProceduralDataset (training items)
    heldout_dataset: Any
    system_prompt: str = ""
    max_new_tokens: int = 256  # room to think a little before the answer block
    _heldout: list[TaskPrompt] = field(default_factory=list)
    _heldout_questions: set[str] = field(default_factory=set)

    def _prompt(self, entry: dict[str, Any]) -> TaskPrompt:
        return TaskPrompt(text=f"{entry['question']}\n{INSTRUCTION}", answer=str(entry["answer"]), meta=entry)

    def heldout(self, n: int) -> list[TaskPrompt]:
        if not self._heldout:
            self._heldout = [self._prompt(self.heldout_dataset[i]) for i in range(MAX_HELDOUT)]
            self._heldout_questions = {p.meta["question"] for p in self._heldout}
        return self._heldout[:n]

    def sample(self, rng: random.Random) -> TaskPrompt:
        self.heldout(0)
        while True:
            entry = self.dataset[rng.randrange(HELDOUT_SEED)]
            if entry["question"] not in self._heldout_questions:
                return self._prompt(entry)

    def reward(self, prompt: TaskPrompt, completion: str) -> float:
        blocks = answer_blocks(completion)
        if not blocks:
            return 0.0
        try:
            score = float(self.dataset.score_answer(blocks[-1], dict(prompt.meta)))
        except Exception:  # a scorer must not take the learner down over odd text
            score = 0.0
        return (1 - FORMAT_WEIGHT) * min(max(score, 0.0), 1.0) + FORMAT_WEIGHT * (len(blocks) == 1)


def make(arg: str) -> ReasoningGymTask:
    """``rg:basic_arithmetic`` or ``rg:basic_arithmetic:min_terms=2,max_terms=3``."""
    rg = _reasoning_gym()
    dataset_name, _, option_text = arg.partition(":")
    if dataset_name not in rg.factory.DATASETS:
        raise TaskError(f"reasoning-gym has no task {dataset_name!r} (`echo-learner tasks` lists them)")
    options = parse_options(option_text)
    for reserved in ("seed", "size"):
        if reserved in options:
            raise TaskError(f"rg: {reserved} is set by the learner (--seed), not by the task spec")
    try:
        train = rg.create_dataset(dataset_name, seed=0, size=HELDOUT_SEED, **options)
        heldout = rg.create_dataset(dataset_name, seed=HELDOUT_SEED, size=MAX_HELDOUT, **options)
    except (TypeError, ValueError, AssertionError) as exc:
        raise TaskError(f"rg:{dataset_name}: {exc}") from None
    return ReasoningGymTask(name=f"rg:{arg}", dataset=train, heldout_dataset=heldout)
