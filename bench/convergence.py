"""Sync vs async training under emulated wide-area links, each run to its plateau.

Runs the same job twice as real processes on 127.0.0.1 (bootstrap, learner,
N nodes): once in sync mode, once in async mode with staleness S, each until
its reward levels off past the threshold (``levelled_off``; at most --steps
and --async-steps). Async steps are cheaper and each learns less from its
slightly stale rollouts, so async takes more of them, in less time. Every
process's upload is capped (--upload-mbit) and every node waits --delay-ms
before each work request and each rollout submission. The learner runs
pinned to its own core(s) and the nodes to the others
(``os.sched_setaffinity``), so that the comparison measures scheduling, not
contention for the CPU.

Prints (``--json``) the time each mode took to reach --threshold (mean reward
over the last 5 steps) and their ratio; each mode's plateau (mean reward over
its last 100 steps) and their gap, signed and absolute; the rewards at equal
steps (async over the same steps as sync's last 100); the learner
utilization measured in the async run, the mean error of the capacity
model's live forecasts made during it (each forecast of the next minute
checked against that minute), and the share of batches refused for being
out of the staleness window.

    python bench/convergence.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from localswarm import SwarmError, local_swarm  # noqa: E402

from echo_learner.verify.verifier import OUT_OF_WINDOW  # noqa: E402

PUBLISH_EVERY = 3
# Each mode stops at its plateau: once past the threshold, when the mean
# reward over its last W steps is within PLATEAU_RISE of the W before, W
# being the steps it took to reach the threshold (at least PLATEAU_STEPS):
# windows as long in learning as in steps, as an async step learns less
# (sync reached 0.5 in 105-130 steps, async in 300-350). Fixed windows of 100
# stopped async at 0.67, a stretch the curve held for 150 steps before
# rising to 0.9-1.0; of 50, both modes early (sync at 0.71, async at 0.88).
# A run whose last PLATEAU_STEPS steps average within PLATEAU_RISE of the
# task's best reward (CEILING) has levelled off too: it can go no higher,
# and past that every group scores alike, the learner skips its steps
# (nothing to learn), its utilization falls to nothing, and forecasts of it
# say nothing useful.
PLATEAU_STEPS = 100
PLATEAU_RISE = 0.02
CEILING = 1.0  # the reverse task's reward for a perfect answer
SYNC_STEPS = 600
ASYNC_STEPS = 1500
# The objective both modes train with (docs/learner.md, "Each mode to its
# plateau" and "A smaller step"): at lr 1e-3 on-policy steps, which the PPO
# clip never bounds, turned the policy certain of wrong answers and sync
# stalled at 0.83 in 3 of 5 bench runs; a bonus of 0.15 left async at 0.76
# after 1,500 steps ("Admission by version, an anchored forecast").
CLIP_EPS = 0.5
ENTROPY_COEF = 0.1
LR = 5e-4
SMOOTH = 5
FINAL = 10


def plateau(metrics: list[dict]) -> float:
    """Mean reward over the last PLATEAU_STEPS steps: where a run has
    levelled off, less noisy than its last few steps."""
    return round(mean([m["reward_mean"] for m in metrics[-PLATEAU_STEPS:]]), 4)


def levelled_off(metrics: list[dict], threshold: float) -> bool:
    """Past the threshold, and either near the task's best reward or no
    longer rising (see PLATEAU_STEPS)."""
    reached = steps_to_threshold(metrics, threshold)
    if reached is None or len(metrics) < PLATEAU_STEPS:
        return False
    rewards = [m["reward_mean"] for m in metrics]
    if mean(rewards[-PLATEAU_STEPS:]) >= CEILING - PLATEAU_RISE:
        return True
    window = max(PLATEAU_STEPS, reached)
    if len(rewards) < 2 * window:
        return False
    return mean(rewards[-window:]) - mean(rewards[-2 * window : -window]) < PLATEAU_RISE


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def steps_to_threshold(metrics: list[dict], threshold: float) -> int | None:
    """Steps until the mean reward over SMOOTH steps first reached ``threshold``."""
    rewards = [m["reward_mean"] for m in metrics]
    for i in range(SMOOTH - 1, len(metrics)):
        if mean(rewards[i - SMOOTH + 1 : i + 1]) >= threshold:
            return i + 1
    return None


def time_to_threshold(metrics: list[dict], threshold: float) -> float | None:
    reached = steps_to_threshold(metrics, threshold)
    return None if reached is None else metrics[reached - 1]["elapsed_s"]


def pinning(nodes: int) -> dict[str, set[int]]:
    """CPU sets by process name: the learner on its own core (two if there are
    eight or more), everything else on the rest; none on a 1-CPU machine."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {}
    learner, rest = cpus[: 2 if len(cpus) >= 8 else 1], cpus[2 if len(cpus) >= 8 else 1 :]
    return {"learner": set(learner), "bootstrap": set(rest), **{f"node{i}": set(rest) for i in range(nodes)}}


def run(mode: str, steps: int, args: argparse.Namespace, root: Path, cpus: dict[str, set[int]]) -> list[dict]:
    cap = ("--max-upload-mbit", str(args.upload_mbit))
    verbose = ("-v",) if args.verbose else ()
    with local_swarm(root) as swarm:
        swarm.cpus = cpus
        swarm.start_bootstrap()
        learner = swarm.start_learner(
            "--mode",
            mode,
            "--staleness",
            str(args.staleness),
            "--publish-every",
            str(args.publish_every),
            "--steps",
            str(steps),
            "--seed",
            str(args.seed),
            "--lr",
            str(args.lr),
            "--clip-eps",
            str(args.clip_eps),
            "--entropy-coef",
            str(args.entropy_coef),
            "--push-down-flat" if args.push_down_flat else "--no-push-down-flat",
            *cap,
            *verbose,
        )
        for i in range(args.nodes):
            swarm.start_node(i, *cap, "--emulate-delay-ms", str(args.delay_ms), *verbose)
        deadline = time.monotonic() + args.timeout_s
        while len(metrics := swarm.metrics()) < steps and not levelled_off(metrics, args.threshold):
            if learner.poll() is not None and len(swarm.metrics()) < steps:
                raise SwarmError(f"{mode}: learner exited {learner.returncode}; see {root}/learner.log")
            if time.monotonic() > deadline:
                raise SwarmError(f"{mode}: {steps} steps not done in {args.timeout_s:.0f} s; see {root}")
            time.sleep(0.5)  # polling the learner's metrics file
        # At --steps it stops by itself: wait for it (a SIGINT as it exits
        # would find Python's default handler back and kill it, exit -2). At
        # a plateau it is asked to (SIGINT: checkpoint, ledger, exit 0).
        if len(metrics) >= steps:
            try:
                learner.wait(120)
            except subprocess.TimeoutExpired:
                pass  # stop() below interrupts it, then kills it
        codes = {"learner": swarm.stop("learner", grace_s=120)}
        codes.update(swarm.stop_all())
    if any(codes.values()):
        raise SwarmError(f"{mode}: processes did not leave cleanly: {codes}")
    return metrics[:steps]


def max_step_gap(metrics: list[dict]) -> float:
    """The longest wait between consecutive steps (s): a step held up by a
    prompt nobody answers shows here as about one assignment deadline."""
    elapsed = [m["elapsed_s"] for m in metrics]
    return round(max((b - a for a, b in zip(elapsed, elapsed[1:])), default=0.0), 2)


def stale_refused_fraction(metrics: list[dict]) -> float:
    """Batches refused as out of the staleness window, of all batches judged
    (every node here is honest)."""
    last = metrics[-1]
    judged = last["batches_accepted"] + last["batches_refused"]
    return round(last["refusals"].get(OUT_OF_WINDOW, 0) / judged, 4) if judged else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=SYNC_STEPS,
        help=f"sync: at most this many steps, if no plateau first ({SYNC_STEPS})",
    )
    parser.add_argument(
        "--async-steps",
        type=int,
        default=ASYNC_STEPS,
        help=f"async: at most this many steps, if no plateau first ({ASYNC_STEPS})",
    )
    parser.add_argument("--timeout-s", type=float, default=1800, help="give up on a mode after this long (1800)")
    parser.add_argument("--nodes", type=int, default=3, help="volunteer nodes (3)")
    parser.add_argument("--staleness", type=int, default=2, help="async staleness bound S (2)")
    parser.add_argument(
        "--publish-every", type=int, default=PUBLISH_EVERY, help=f"async: publish every K steps ({PUBLISH_EVERY})"
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--only-async", action="store_true", help="skip the sync run (no comparison)")
    only.add_argument("--only-sync", action="store_true", help="skip the async run (no comparison)")
    parser.add_argument("--threshold", type=float, default=0.5, help="reward threshold (0.5)")
    parser.add_argument(
        "--lr",
        type=float,
        default=LR,
        help=f"the learner's AdamW learning rate, both modes ({LR}: on-policy steps, which the clip never "
        "bounds, do not collapse, docs/learner.md)",
    )
    parser.add_argument(
        "--clip-eps",
        type=float,
        default=CLIP_EPS,
        help=f"the learner's PPO clip range, both modes ({CLIP_EPS}: stale batches still teach, docs/learner.md)",
    )
    parser.add_argument(
        "--entropy-coef",
        type=float,
        default=ENTROPY_COEF,
        help=f"the learner's entropy bonus, both modes ({ENTROPY_COEF}: on-policy steps stop plateauing early)",
    )
    parser.add_argument(
        "--push-down-flat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the learner pushes down groups that all scored alike below the step's mean, both modes "
        "(on: neither mode stalls on answers it has turned certain of, docs/learner.md)",
    )
    parser.add_argument("--upload-mbit", type=float, default=20, help="every process's upload cap (20)")
    parser.add_argument("--delay-ms", type=float, default=50, help="delay before each work/rollout message (50)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the learner and nodes to separate cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-v", "--verbose", action="store_true", help="the learner and nodes log each step (-v)")
    args = parser.parse_args()
    if min(args.steps, args.async_steps) < FINAL:
        parser.error(f"--steps and --async-steps must be at least {FINAL}")

    base = args.dir or Path(tempfile.mkdtemp(prefix="echo-convergence-"))
    shutil.rmtree(base / "sync", ignore_errors=True)
    shutil.rmtree(base / "async", ignore_errors=True)
    cpus = {} if args.no_pin else pinning(args.nodes)
    started = time.monotonic()
    result: dict = {
        "steps": args.steps,
        "async_steps": args.async_steps,
        "nodes": args.nodes,
        "staleness": args.staleness,
        "publish_every": args.publish_every,
        "upload_mbit": args.upload_mbit,
        "delay_ms": args.delay_ms,
        "threshold": args.threshold,
        "objective": {
            "lr": args.lr,
            "clip_eps": args.clip_eps,
            "entropy_coef": args.entropy_coef,
            "push_down_flat": args.push_down_flat,
        },
        "pinning": {"learner": sorted(cpus["learner"]), "nodes": sorted(cpus["node0"])} if cpus else None,
    }
    if not args.only_sync:
        async_ = run("async", args.async_steps, args, base / "async", cpus)
        result.update(
            async_time_to_threshold_s=time_to_threshold(async_, args.threshold),
            async_s=async_[-1]["elapsed_s"],
            async_steps_run=len(async_),
            async_final_reward=round(mean([m["reward_mean"] for m in async_[-FINAL:]]), 4),
            async_plateau=plateau(async_),
            async_learner_utilization=async_[-1]["utilization"],
            async_max_step_gap_s=max_step_gap(async_),
            forecast_error=async_[-1]["forecast_error"],
            stale_refused_fraction=stale_refused_fraction(async_),
            async_mean_staleness=round(mean([m["staleness"] for m in async_]), 3),
        )
    if not args.only_async:
        sync = run("sync", args.steps, args, base / "sync", cpus)
        sync_t, async_t = time_to_threshold(sync, args.threshold), result.get("async_time_to_threshold_s")
        result.update(
            sync_time_to_threshold_s=sync_t,
            sync_s=sync[-1]["elapsed_s"],
            sync_steps_run=len(sync),
            sync_final_reward=round(mean([m["reward_mean"] for m in sync[-FINAL:]]), 4),
            sync_plateau=plateau(sync),
            sync_learner_utilization=sync[-1]["utilization"],
            sync_max_step_gap_s=max_step_gap(sync),
            sync_stale_refused_fraction=stale_refused_fraction(sync),
        )
        if not args.only_sync:
            result["async_over_sync_time"] = round(async_t / sync_t, 3) if sync_t and async_t else None
            delta = result["async_plateau"] - result["sync_plateau"]
            result["plateau_gap"] = round(abs(delta), 4)
            result["async_minus_sync_plateau"] = round(delta, 4)  # > 0: async levelled off higher
            # The same steps as sync's plateau: what staleness costs per step.
            if len(async_) >= len(sync):
                at_equal = mean([m["reward_mean"] for m in async_[len(sync) - PLATEAU_STEPS : len(sync)]])
                result["async_minus_sync_at_equal_steps"] = round(at_equal - result["sync_plateau"], 4)
    result["wall_s"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SwarmError as exc:
        print(f"convergence: failed: {exc}", file=sys.stderr)
        sys.exit(1)
