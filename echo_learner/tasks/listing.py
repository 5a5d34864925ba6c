"""``echo-learner tasks``: what --task can name, or a few prompts of one task."""

from __future__ import annotations

import argparse
import json
import random

from echo_learner.tasks import rg
from echo_learner.tasks.base import TaskError
from echo_learner.tasks.registry import families, load_task
from protocol.process.config import fail


def command(args: argparse.Namespace, prog: str) -> None:
    if args.n < 1:
        fail(prog, "-n must be at least 1")
    if args.spec is None:
        try:
            datasets = rg.dataset_names()
        except TaskError as exc:
            datasets = [str(exc)]
        if args.json:
            print(json.dumps({"families": families(), "reasoning_gym": datasets}, indent=2))
            return
        for name, target in sorted(families().items()):
            print(f"{name:<12} {target}")
        print("rg: / math: tasks: " + ", ".join(datasets))
        return
    try:
        task = load_task(args.spec)
    except TaskError as exc:
        fail(prog, str(exc))
    rng = random.Random(args.seed)
    prompts = [task.sample(rng) for _ in range(args.n)]
    if args.json:
        print(json.dumps({"task": task.name, "prompts": [{"text": p.text, "answer": p.answer} for p in prompts]}))
        return
    for p in prompts:
        print(f"--- {task.name}\n{p.text}\n=> {p.answer}")
