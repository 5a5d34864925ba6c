"""Sync vs async training under emulated wide-area links, for the same wall time.

Runs the same job twice as real processes on 127.0.0.1 (bootstrap, learner,
N nodes): once in sync mode, once in async mode with staleness S. Every
process's upload is capped (--upload-mbit) and every node waits --delay-ms
before each work request and each rollout submission. Each run lasts
--budget-s seconds of the learner's clock.

Prints (``--json``) the time each mode took to reach --threshold (mean reward
over the last 5 steps), the final rewards (mean of the last 10 steps), the
learner utilization measured in the async run, and the capacity model's
forecast of it, computed from the sync run's measurements alone, before the
async run starts.

    python bench/convergence.py --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from echo_learner.capacity import forecast  # noqa: E402
from localswarm import SwarmError, local_swarm  # noqa: E402

PUBLISH_EVERY = 3
SMOOTH = 5
FINAL = 10


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def time_to_threshold(metrics: list[dict], threshold: float) -> float | None:
    rewards = [m["reward_mean"] for m in metrics]
    for i in range(SMOOTH - 1, len(metrics)):
        if mean(rewards[i - SMOOTH + 1 : i + 1]) >= threshold:
            return metrics[i]["elapsed_s"]
    return None


def run(mode: str, args: argparse.Namespace, root: Path) -> list[dict]:
    cap = ("--max-upload-mbit", str(args.upload_mbit))
    with local_swarm(root) as swarm:
        swarm.start_bootstrap()
        learner = swarm.start_learner(
            "--mode", mode, "--staleness", str(args.staleness), "--publish-every", str(args.publish_every),
            "--steps", "1000000",
            "--seed", str(args.seed), *cap,
        )
        for i in range(args.nodes):
            swarm.start_node(i, *cap, "--emulate-delay-ms", str(args.delay_ms))
        deadline = time.monotonic() + args.budget_s + 120  # start-up allowance
        while True:
            metrics = swarm.metrics()
            if metrics and metrics[-1]["elapsed_s"] >= args.budget_s:
                break
            if learner.poll() is not None:
                raise SwarmError(f"{mode}: learner exited {learner.returncode}; see {root}/learner.log")
            if time.monotonic() > deadline:
                raise SwarmError(f"{mode}: budget not reached in time; see {root}")
            time.sleep(0.5)  # polling the learner's metrics file
        codes = swarm.stop_all()
    if any(codes.values()):
        raise SwarmError(f"{mode}: processes did not leave cleanly: {codes}")
    return [m for m in swarm.metrics() if m["elapsed_s"] <= args.budget_s]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=300, help="learner seconds per mode (300)")
    parser.add_argument("--nodes", type=int, default=3, help="volunteer nodes (3)")
    parser.add_argument("--staleness", type=int, default=2, help="async staleness bound S (2)")
    parser.add_argument("--publish-every", type=int, default=PUBLISH_EVERY,
                        help=f"async: publish every K steps ({PUBLISH_EVERY})")
    parser.add_argument("--only-async", action="store_true", help="skip the sync run (no comparison)")
    parser.add_argument("--threshold", type=float, default=0.5, help="reward threshold (0.5)")
    parser.add_argument("--upload-mbit", type=float, default=20, help="every process's upload cap (20)")
    parser.add_argument("--delay-ms", type=float, default=50, help="delay before each work/rollout message (50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    base = args.dir or Path(tempfile.mkdtemp(prefix="echo-convergence-"))
    shutil.rmtree(base / "sync", ignore_errors=True)
    shutil.rmtree(base / "async", ignore_errors=True)
    started = time.monotonic()
    if args.only_async:
        async_ = run("async", args, base / "async")
        print(json.dumps({"async_time_to_threshold_s": time_to_threshold(async_, args.threshold),
                          "async_steps": len(async_), "last": async_[-1]}))
        return 0
    sync = run("sync", args, base / "sync")
    # The forecast uses only what the sync run measured.
    measured = dict(sync[-1]["capacity"], staleness=args.staleness, publish_every=args.publish_every)
    predicted = forecast(**measured).utilization
    async_ = run("async", args, base / "async")

    sync_t = time_to_threshold(sync, args.threshold)
    async_t = time_to_threshold(async_, args.threshold)
    result = {
        "budget_s": args.budget_s,
        "nodes": args.nodes,
        "staleness": args.staleness,
        "publish_every": args.publish_every,
        "upload_mbit": args.upload_mbit,
        "delay_ms": args.delay_ms,
        "threshold": args.threshold,
        "sync_steps": len(sync),
        "async_steps": len(async_),
        "sync_time_to_threshold_s": sync_t,
        "async_time_to_threshold_s": async_t,
        "async_over_sync_time": round(async_t / sync_t, 3) if sync_t and async_t else None,
        "sync_final_reward": round(mean([m["reward_mean"] for m in sync[-FINAL:]]), 4),
        "async_final_reward": round(mean([m["reward_mean"] for m in async_[-FINAL:]]), 4),
        "sync_learner_utilization": sync[-1]["utilization"],
        "async_learner_utilization": async_[-1]["utilization"],
        "predicted_learner_utilization": round(predicted, 4),
        "forecast_inputs": measured,
        "async_mean_staleness": round(mean([m["staleness"] for m in async_]), 3),
        "wall_s": round(time.monotonic() - started, 1),
    }
    # Per-step learning quality: async's reward after as many steps as sync took.
    n = min(len(sync), len(async_))
    result["async_reward_at_sync_steps"] = round(
        mean([m["reward_mean"] for m in async_[max(0, n - FINAL) : n]]), 4
    )
    result["final_reward_gap"] = round(abs(result["sync_final_reward"] - result["async_final_reward"]), 4)
    result["forecast_error"] = round(abs(predicted - result["async_learner_utilization"]), 4)
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
