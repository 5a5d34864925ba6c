"""Held-out accuracy while training: every K-th published version is scored
on the task's held-out prompts (greedy decoding), in a worker thread so that
training never waits on it. Results go to the status API, ``/metrics`` and
``heldout.jsonl`` in the data dir."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import deque
from pathlib import Path

import torch
import trio
from transformers import PreTrainedTokenizerBase

from echo_learner.tasks.base import Task, TaskError
from echo_learner.training.evaluate import EvalSettings, evaluate
from protocol.process.logs import event

log = logging.getLogger(__name__)
KEPT = 1000  # results kept in memory for the status API


class HeldoutMonitor:
    def __init__(
        self,
        task: Task,
        tokenizer: PreTrainedTokenizerBase,
        *,
        every: int,
        prompts: int,
        max_new_tokens: int,
        system_prompt: str,
        path: Path,
    ):
        self.task = task
        self.tokenizer = tokenizer
        self.every = every
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.system_prompt = system_prompt
        self.path = path
        # A resumed run shows the scores of the versions before it too.
        self.results: deque[dict] = deque(_read(path), maxlen=KEPT)
        # The newest version due for scoring, with its frozen weights; one
        # still being scored when the next is due is skipped, not queued.
        self._due: tuple[int, int, torch.nn.Module] | None = None
        self._wake = trio.Event()

    def on_publish(self, version: int, step: int, model: torch.nn.Module) -> None:
        """``model`` is the frozen copy of ``version``, published after
        training step ``step`` (it is only read)."""
        if self.every and version % self.every == 0:
            self._due = (version, step, model)
            self._wake.set()

    def latest(self) -> dict | None:
        return self.results[-1] if self.results else None

    async def run(self) -> None:
        if not self.every:
            return
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            assert self._due is not None
            (version, step, model), self._due = self._due, None
            started = time.monotonic()
            settings = EvalSettings(
                n=self.prompts, k=0, max_new_tokens=self.max_new_tokens, system_prompt=self.system_prompt
            )
            score = functools.partial(evaluate, model, self.tokenizer, self.task, settings)
            try:
                result = await _stoppable(score)
            except TaskError as exc:  # the task has no held-out split
                event(log, logging.WARNING, "no held-out evaluation", error=exc)
                return
            record = {
                "version": version,
                "step": step,
                "time": time.time(),
                "accuracy": result["greedy"]["value"],
                "ci95": result["greedy"]["ci95"],
                "mean_reward": result["greedy_mean_reward"],
                "prompts": result["heldout_n"],
                "seconds": round(time.monotonic() - started, 2),
            }
            self.results.append(record)
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            event(log, logging.INFO, "held-out", **record)


async def _stoppable(score: functools.partial) -> dict:
    """``score(stop=...)`` in a worker thread. Cancelled, it stops the thread
    and waits for it: a half-done score is worth nothing, and a thread left
    running torch when the interpreter exits aborts the process (SIGABRT,
    "terminate called without an active exception")."""
    stop, done = threading.Event(), threading.Event()

    def work() -> dict:
        try:
            return score(stop=stop)
        finally:
            done.set()

    try:
        return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
    except trio.Cancelled:
        stop.set()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(done.wait)
        raise


def _read(path: Path) -> list[dict]:
    """The records of ``path``; a line cut short by a crash is skipped."""
    records = []
    for line in path.read_text().splitlines()[-KEPT:] if path.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
