"""The learner's objective without the swarm: does a mode stall?

Trains the built-in model on the reverse task in one process with the
learner's own Trainer, on rollouts of the node's torch backend, in either
mode: ``sync`` samples every step from the newest weights (on-policy, as
``--mode sync``); ``async`` from a version 0-2 publishes behind, published
every ``--publish-every`` steps (stale, as ``--mode async`` with
``--staleness 2``). Prints one JSON line per ``--every`` steps: the mean
reward, the share of groups that scored all alike below the best reward
(what a stall is made of, docs/learner.md) and at it. A quick way to try an
objective on several seeds (about 70 s for 600 sync steps on one core)
before the 10-20 minutes of ``bench/convergence.py``:

    .venv/bin/python bench/objective.py --mode sync --seed 3 --lr 1e-3     # stalls near 0.87
    .venv/bin/python bench/objective.py --mode sync --seed 3 --push-down-flat --lr 5e-4
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from echo_learner.tasks.reverse import ReverseTask  # noqa: E402
from echo_learner.training.lora import state_bytes  # noqa: E402
from echo_learner.training.model import build_model, build_tokenizer, config_json, render_prompt  # noqa: E402
from echo_learner.training.trainer import Objective, ScoredGroup, Trainer  # noqa: E402
from echo_node.backend_torch import TorchBackend  # noqa: E402

PROMPTS, GROUP = 16, 16  # the learner's defaults: prompts per step, completions per prompt
# Versions behind: 1.3 on average, near the bench's async runs (1.4-1.5, `async_mean_staleness`).
LAGS, LAG_WEIGHTS = (0, 1, 2), (0.05, 0.6, 0.35)
BEST = 1.0  # the reverse task's reward for a perfect answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate (5e-4, as the bench)")
    parser.add_argument("--clip-eps", type=float, default=0.5, help="PPO clip range (0.5, as the bench)")
    parser.add_argument("--entropy-coef", type=float, default=0.1, help="entropy bonus (0.1, as the bench)")
    parser.add_argument("--push-down-flat", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--publish-every", type=int, default=3, help="async: publish every K steps (3)")
    parser.add_argument("--every", type=int, default=100, help="print every N steps (100)")
    args = parser.parse_args()
    if args.steps < 1 or args.every < 1 or args.publish_every < 1:
        parser.error("--steps, --every and --publish-every must be at least 1")

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    task, tokenizer, model = ReverseTask(), build_tokenizer(), build_model()
    objective = Objective(args.clip_eps, 3.0, 0.0, args.entropy_coef, args.push_down_flat)
    trainer = Trainer(model, lr=args.lr, objective=objective, pad_id=tokenizer.pad_token_id)
    published: list[TorchBackend] = []

    def publish() -> None:
        backend = TorchBackend(threads=1)
        backend.load(config_json(model), state_bytes(model))
        published.append(backend)
        del published[: -(max(LAGS) + 1)]

    publish()
    rewards: list[float] = []
    groups_seen: Counter[str] = Counter()
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        lag = 0 if args.mode == "sync" else rng.choices(LAGS, LAG_WEIGHTS)[0]
        backend = published[max(0, len(published) - 1 - lag)]
        prompts = [task.sample(rng) for _ in range(PROMPTS)]
        tokens = [render_prompt(tokenizer, p.text) for p in prompts]
        samples = backend.generate(
            tokens,
            group_size=GROUP,
            max_new_tokens=task.max_new_tokens,
            temperature=1.0,
            stop_ids=(tokenizer.eos_token_id,),
        )
        groups = []
        for prompt, prompt_tokens, group in zip(prompts, tokens, samples):
            scores = tuple(task.reward(prompt, tokenizer.decode(s.tokens, skip_special_tokens=True)) for s in group)
            groups_seen["varied" if len(set(scores)) > 1 else "flat_best" if scores[0] == BEST else "flat_below"] += 1
            groups.append(
                ScoredGroup(
                    tuple(prompt_tokens),
                    tuple(tuple(s.tokens) for s in group),
                    tuple(tuple(s.logprobs) for s in group),
                    scores,
                )
            )
        rewards.append(trainer.step(groups).reward_mean)
        if args.mode == "sync" or step % args.publish_every == 0:
            publish()
        if step % args.every == 0:
            total = sum(groups_seen.values())
            line = {
                "step": step,
                "reward": round(sum(rewards[-args.every :]) / args.every, 3),
                **{kind: round(groups_seen[kind] / total, 2) for kind in ("varied", "flat_below", "flat_best")},
                "s": round(time.monotonic() - started, 1),
            }
            print(json.dumps(line), flush=True)
            groups_seen.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
