"""``make demo``: a whole Echo Swarm on this machine, end to end.

One bootstrap peer, one learner and volunteer nodes, each its own process on
127.0.0.1. By default three nodes train the built-in model on the reverse
task; with ``--real`` (``make demo-real``) two nodes, one generating with
llama.cpp and one with torch, train SmolLM2-135M-Instruct on two-term sums
and the learner scores held-out prompts as it goes. Shows progress while it
runs (a progress bar in a terminal, a line per step otherwise) and one
summary line at the end; every process it started is gone when it returns.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localswarm import SwarmError, local_swarm  # noqa: E402

# The real job of bench/learning.py (docs/tasks.md, "A real job"), shorter.
REAL_TASK = "math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
REAL_LEARNER = (
    "--model",
    "smollm2",
    "--task",
    REAL_TASK,
    "--temperature",
    "0.7",
    "--lr",
    "3e-5",
    "--group-size",
    "8",
    "--prompts-per-step",
    "4",
    "--prompts-per-request",
    "1",
    "--max-new-tokens",
    "64",
    "--torch-threads",
    "2",
    "--eval-every",
    "5",
    "--eval-prompts",
    "32",
)
REAL_BACKENDS = ("llama", "torch")


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def heldout(data_dir: Path) -> str:
    """The newest in-training held-out score, as text."""
    path = data_dir / "heldout.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    if not lines:
        return "-"
    last = json.loads(lines[-1])
    return f"{last['accuracy']:.2f} (step {last['step']})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--real", action="store_true", help="SmolLM2-135M-Instruct on two-term sums, a llama.cpp and a torch node"
    )
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: 150; --real: 15)")
    parser.add_argument("--nodes", type=int, default=None, help="volunteer nodes (default: 3; --real: 2)")
    parser.add_argument("--dir", type=Path, default=Path("demo-data"), help="logs and state")
    parser.add_argument(
        "--timeout-s", type=float, default=None, help="give up after this long (default: 600; --real: 1800)"
    )
    args = parser.parse_args()
    steps = args.steps or (15 if args.real else 150)
    nodes = args.nodes or (2 if args.real else 3)
    timeout_s = args.timeout_s or (1800 if args.real else 600)

    shutil.rmtree(args.dir, ignore_errors=True)
    started = time.monotonic()
    learner_dir = args.dir / "learner"
    with local_swarm(args.dir) as swarm:
        print(f"demo: starting bootstrap, learner and {nodes} nodes (logs in {args.dir}/)")
        addr = swarm.start_bootstrap()
        print(f"demo: bootstrap at {addr}")
        learner = swarm.start_learner("--steps", str(steps), *(REAL_LEARNER if args.real else ()))
        for i in range(nodes):
            backend = ("--backend", REAL_BACKENDS[i % 2]) if args.real else ()
            swarm.start_node(i, *backend)
        if args.real:
            print("demo: loading SmolLM2-135M-Instruct in every process; the first step takes a minute or two")
        # Held-out accuracy only for the real job: the toy task's 4-token
        # budget leaves no room for the eos that a fully right answer needs.
        columns = [
            TextColumn("[bold]training"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TextColumn("reward {task.fields[reward]}"),
            *([TextColumn("held-out {task.fields[heldout]}")] if args.real else []),
            TextColumn("rollouts {task.fields[rollouts]}"),
            TimeElapsedColumn(),
        ]
        # In a terminal a live bar; in a log (CI, a pipe) a line per step.
        with Progress(*columns, disable=not sys.stdout.isatty()) as progress:
            bar = progress.add_task("training", total=steps, reward="-", heldout="-", rollouts=0)
            shown, page = -1, ""
            while learner.poll() is None:
                api = learner_dir / "api.json"
                if not page and api.exists():
                    page = json.loads(api.read_text())["url"]
                    progress.console.print(f"demo: status page: {page}")
                if time.monotonic() - started > timeout_s:
                    raise SwarmError(f"learner did not finish within {timeout_s:.0f} s")
                metrics = swarm.metrics()
                if metrics and metrics[-1]["step"] != shown:
                    m = metrics[-1]
                    shown = m["step"]
                    reward = f"{mean([x['reward_mean'] for x in metrics[-5:]]):.3f}"
                    progress.update(
                        bar,
                        completed=shown + 1,
                        reward=reward,
                        heldout=heldout(learner_dir),
                        rollouts=m["rollouts_accepted"],
                    )
                    if progress.disable:
                        scored = f"held-out {heldout(learner_dir)}  " if args.real else ""
                        print(
                            f"demo: step {shown + 1:4d}/{steps}  version {m['version']:4d}  reward {reward}  "
                            f"{scored}rollouts {m['rollouts_accepted']:6d}  "
                            f"nodes {m['contributors']}  {m['elapsed_s']:.0f}s",
                            flush=True,
                        )
                time.sleep(0.5)  # polling a log file for display only
        if learner.returncode != 0:
            raise SwarmError(f"learner exited with {learner.returncode}; see {args.dir}/learner.log")
        codes = swarm.stop_all()
        bad = {name: code for name, code in codes.items() if code != 0}
        if bad:
            raise SwarmError(f"processes did not leave cleanly: {bad}")
    metrics = swarm.metrics()
    rewards = [m["reward_mean"] for m in metrics]
    last = metrics[-1]
    print(
        f"demo: steps={len(metrics)} versions={last['version']} nodes={last['contributors']} "
        f"rollouts_accepted={last['rollouts_accepted']} reward_first={mean(rewards[:5]):.3f} "
        f"reward_last={mean(rewards[-5:]):.3f}" + (f" heldout={heldout(learner_dir)}" if args.real else "")
    )
    if args.real:
        print(f"demo: score the result on 200 held-out prompts: .venv/bin/echo-learner eval --data-dir {learner_dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SwarmError as exc:
        print(f"demo: failed: {exc}", file=sys.stderr)
        sys.exit(1)
