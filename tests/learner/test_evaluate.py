import random
import threading
from dataclasses import dataclass

import pytest
import trio

from echo_learner.tasks.base import TaskError, TaskPrompt
from echo_learner.tasks.registry import load_task
from echo_learner.training.evaluate import EvalSettings, Stopped, evaluate, mean_with_ci, wilson
from echo_learner.training.heldout import HeldoutMonitor
from echo_learner.training.model import load_model


def test_wilson_interval():
    assert wilson(5, 10).ci95 == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10).ci95[0] == 0.0 and wilson(10, 10).ci95[1] == 1.0
    assert wilson(0, 10).ci95[1] > 0.2  # no solve in 10 is not proof of never
    assert mean_with_ci([0.5, 0.5, 0.5]).ci95 == (0.5, 0.5)


@dataclass
class Judge:
    """A held-out split of reverse prompts; the reward says whether the
    completion starts with ``prefix`` (every completion does with "")."""

    prefix: str
    name: str = "judge"
    system_prompt: str = ""
    max_new_tokens: int = 4

    def sample(self, rng: random.Random) -> TaskPrompt:
        raise AssertionError("evaluation never draws training prompts")

    def heldout(self, n: int) -> list[TaskPrompt]:
        return [TaskPrompt(f"{s}=", s[::-1]) for s in ("abc", "bca", "cab", "dab", "add")][:n]

    def reward(self, prompt: TaskPrompt, completion: str) -> float:
        return float(completion.startswith(self.prefix))


def test_evaluation_counts_what_the_task_rewards():
    model, tokenizer = load_model("", seed=0)
    everything = evaluate(model, tokenizer, Judge(""), EvalSettings(n=4, k=3, max_new_tokens=4))
    assert everything["heldout_n"] == 4
    assert everything["greedy"]["value"] == 1.0 and everything["pass1"]["value"] == 1.0
    nothing = evaluate(model, tokenizer, Judge("\x00impossible"), EvalSettings(n=4, k=3, max_new_tokens=4))
    assert nothing["greedy"]["value"] == 0.0 and nothing["pass1"]["value"] == 0.0
    assert nothing["greedy"]["ci95"][1] > 0  # 4 prompts prove little


def test_a_task_without_heldout_prompts_cannot_be_evaluated():
    class NoSplit(Judge):
        def heldout(self, n):
            return []

    model, tokenizer = load_model("", seed=0)
    with pytest.raises(TaskError, match="no held-out prompts"):
        evaluate(model, tokenizer, NoSplit(""), EvalSettings(n=4, k=0, max_new_tokens=4))


def test_a_stopped_evaluation_ends_within_one_forward_pass():
    model, tokenizer = load_model("", seed=0)
    stop = threading.Event()
    passes = []
    model.register_forward_pre_hook(lambda *_: passes.append(1) or stop.set())
    with pytest.raises(Stopped):
        evaluate(model, tokenizer, Judge(""), EvalSettings(n=4, k=3, max_new_tokens=4), stop=stop)
    assert len(passes) == 1


def test_held_out_scoring_cancelled_leaves_no_thread_running_the_model(tmp_path):
    """A learner that stops while a held-out score runs must wait for its
    thread: one left inside torch when the interpreter exits aborts it."""
    model, tokenizer = load_model("", seed=0)
    monitor = HeldoutMonitor(
        load_task("reverse"),
        tokenizer,
        every=1,
        prompts=2000,
        max_new_tokens=4,
        system_prompt="",
        path=tmp_path / "heldout.jsonl",
    )
    inside = threading.Semaphore(0)  # released at every forward pass's start
    running = []

    def enter(*_):
        running.append(1)
        inside.release()

    def leave(*_) -> None:  # returns None: a forward hook's value would replace the model's output
        running.pop()

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor.run)
            monitor.on_publish(0, 0, model)
            await trio.to_thread.run_sync(inside.acquire)  # scoring has begun
            nursery.cancel_scope.cancel()
        return len(running)

    assert trio.run(main) == 0
    assert monitor.latest() is None  # a half-done score is not recorded
