"""Does a real model learn? SmolLM2-135M-Instruct, GRPO, held-out accuracy before and after.

Scores the base model on --heldout-n held-out prompts (greedy, `echo-learner
eval --base`), then runs a whole swarm as real processes on 127.0.0.1 for at
most --budget-min minutes of training: a bootstrap peer, the learner and two
nodes, one generating with llama.cpp and one with torch. When the budget is
spent the learner is stopped (Ctrl-C: it checkpoints the steps trained), and
the checkpoint is scored on the same held-out prompts, which training never
saw (docs/tasks.md, "Held-out prompts").

Prints (``--json``) task, heldout_n, heldout_before/after (greedy accuracy),
ci95_before/after (Wilson), steps, rollouts_accepted, reward_first/last (mean
reward of the first and last --smooth steps), improvement and
improvement_over_cis (improvement minus both intervals' half-widths: above 0
means a real change, not noise), the reward curve and the in-training
held-out scores.

    python bench/learning.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from localswarm import SwarmError, local_swarm  # noqa: E402

# Two-term sums of one-digit numbers: SmolLM2-135M-Instruct solves about a
# third of them (docs/tasks.md): enough right answers for GRPO to reinforce,
# and answers short enough for 2 CPU cores to show learning within minutes.
TASK = "math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1"


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def evaluate(data_dir: Path, args: argparse.Namespace, *, base: bool) -> dict:
    """`echo-learner eval` as an operator would run it."""
    cmd = [
        sys.executable,
        "-m",
        "echo_learner",
        "eval",
        "--data-dir",
        str(data_dir),
        "-n",
        str(args.heldout_n),
        "-k",
        "0",
        "--json",
        "--model",
        "smollm2",
        "--task",
        args.task,
        "--max-new-tokens",
        str(args.max_new_tokens),
    ]
    if base:
        cmd.append("--base")
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SwarmError(f"eval failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["eval_s"] = round(time.monotonic() - started, 1)
    return result


def train(root: Path, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """The swarm, for the budget; returns the learner's metrics and held-out scores."""
    with local_swarm(root) as swarm:
        swarm.start_bootstrap()
        learner = swarm.start_learner(
            "--model",
            "smollm2",
            "--task",
            args.task,
            "--steps",
            "100000",
            "--seed",
            str(args.seed),
            "--lr",
            str(args.lr),
            "--temperature",
            str(args.temperature),
            "--group-size",
            str(args.group_size),
            "--prompts-per-step",
            str(args.prompts_per_step),
            "--prompts-per-request",
            "1",
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--torch-threads",
            str(os.cpu_count() or 1),
            "--eval-every",
            str(args.eval_every),
            "--eval-prompts",
            str(args.eval_prompts),
            "--checkpoint-every",
            "1000",
        )
        swarm.start_node(0, "--backend", "llama")
        swarm.start_node(1, "--backend", "torch")
        deadline = time.monotonic() + args.budget_min * 60
        shown = -1
        while time.monotonic() < deadline:
            if learner.poll() is not None:
                raise SwarmError(f"learner exited with {learner.returncode}; see {root}/learner.log")
            metrics = swarm.metrics()
            if metrics and metrics[-1]["step"] != shown and not args.json:
                m = metrics[-1]
                shown = m["step"]
                print(
                    f"step {shown:4d}  reward {m['reward_mean']:.3f}  rollouts {m['rollouts_accepted']}  "
                    f"{m['elapsed_s']:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(1)  # polling a log file for display only
        # Ctrl-C: the learner writes a checkpoint of every step it trained.
        if swarm.stop("learner", grace_s=300) != 0:
            raise SwarmError(f"learner did not stop cleanly; see {root}/learner.log")
        swarm.stop_all()
        heldout_path = root / "learner" / "heldout.jsonl"
        heldout = [json.loads(x) for x in heldout_path.read_text().splitlines()] if heldout_path.exists() else []
        return swarm.metrics(), heldout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=TASK, help=f"task spec (default: {TASK})")
    parser.add_argument("--budget-min", type=float, default=25, help="minutes of training (default: 25)")
    parser.add_argument("--heldout-n", type=int, default=200, help="held-out prompts scored (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="training prompts' seed (default: 0)")
    parser.add_argument("--lr", type=float, default=3e-5, help="AdamW learning rate (default: 3e-5)")
    parser.add_argument("--temperature", type=float, default=0.7, help="rollouts' temperature (default: 0.7)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (default: 8)")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="groups per step (default: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="answer budget (default: 64)")
    parser.add_argument("--eval-every", type=int, default=10, help="in-training held-out eval every N versions")
    parser.add_argument("--eval-prompts", type=int, default=32, help="prompts of each in-training eval")
    parser.add_argument("--smooth", type=int, default=5, help="steps averaged for reward_first/last")
    parser.add_argument("--dir", type=Path, default=None, help="keep logs and checkpoints here")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    root = args.dir or Path(os.environ.get("TMPDIR", "/tmp")) / "echo-learning-bench"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    started = time.monotonic()
    before = evaluate(root / "learner", args, base=True)
    print(f"base model: {before['greedy']}", file=sys.stderr, flush=True)
    metrics, heldout = train(root, args)
    if not metrics:
        raise SwarmError(f"no training step within {args.budget_min} min; see {root}/learner.log")
    after = evaluate(root / "learner", args, base=False)
    rewards = [m["reward_mean"] for m in metrics]
    improvement = after["greedy"]["value"] - before["greedy"]["value"]

    def half_width(acc: dict) -> float:
        lo, hi = acc["ci95"]
        return (hi - lo) / 2

    result = {
        "task": args.task,
        "model": before["model"],
        "heldout_n": before["heldout_n"],
        "heldout_before": before["greedy"]["value"],
        "heldout_after": after["greedy"]["value"],
        "ci95_before": before["greedy"]["ci95"],
        "ci95_after": after["greedy"]["ci95"],
        "improvement": round(improvement, 4),
        "improvement_over_cis": round(improvement - half_width(before["greedy"]) - half_width(after["greedy"]), 4),
        "steps": after["step"],
        "rollouts_accepted": metrics[-1]["rollouts_accepted"],
        "reward_first": round(mean(rewards[: args.smooth]), 4),
        "reward_last": round(mean(rewards[-args.smooth :]), 4),
        "train_s": metrics[-1]["elapsed_s"],
        "wall_s": round(time.monotonic() - started, 1),
        "eval_s": [before["eval_s"], after["eval_s"]],
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "dir", "task")},
        "reward_curve": [round(mean(rewards[i : i + args.smooth]), 3) for i in range(0, len(rewards), args.smooth)],
        "heldout_curve": [{"step": h["step"], "accuracy": h["accuracy"], "prompts": h["prompts"]} for h in heldout],
        "example_after": after["example"],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
