"""Work sized to each node vs fixed-size assignments, on nodes of very different speed.

Runs the same job twice as real processes on 127.0.0.1 (bootstrap, learner,
4 nodes): once with the learner sizing each assignment to the node's measured
throughput (``echo_learner/swarm/sizing.py``), once with every request given
--prompts-per-request (``--no-size-work``). The nodes' speeds differ by 20x:
each generates no faster than its --speeds entry in tokens/s (the node's
``--emulate-tokens-per-s`` testing aid: a slower machine without using the
CPU the others need; this machine has 2 cores for 5 processes).

Prints (``--json``) per mode: expired_assignments (prompts left to expire:
the target is 0 with sizing), assigned_share (each node's share of the
prompts handed out), accepted_share (of the rollouts accepted),
throughput_share (of the throughput the learner measured: each node's
rollouts/s while working), the largest |accepted - throughput| share gap,
and learner utilization (the share of time the learner trained, over the
run) with its ratio to the fixed run's.

    python bench/heterogeneity.py --json
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
sys.path.insert(0, str(ROOT / "scripts"))

from localswarm import SwarmError, local_swarm  # noqa: E402


def shares(values: dict[str, float]) -> dict[str, float]:
    total = sum(values.values()) or 1.0
    return {k: round(v / total, 4) for k, v in values.items()}


def run(sized: bool, args: argparse.Namespace, root: Path) -> dict:
    """One run; the learner's view of each node at the end."""
    with local_swarm(root) as swarm:
        swarm.start_bootstrap()
        learner = swarm.start_learner(
            "--mode",
            args.mode,
            "--steps",
            "1000000",
            "--seed",
            str(args.seed),
            "--group-size",
            str(args.group_size),
            "--prompts-per-step",
            str(args.prompts_per_step),
            "--prompts-per-request",
            str(args.prompts_per_request),
            "--assignment-timeout-s",
            str(args.deadline_s),
            "--capacity-window-s",
            str(args.budget_s),
            "--size-work" if sized else "--no-size-work",
        )
        for i, speed in enumerate(args.speeds):
            swarm.start_node(
                i, "--backend", "torch", "--emulate-tokens-per-s", str(speed), "--name", f"node{i} {speed:g} tok/s"
            )
        started = None
        deadline = time.monotonic() + args.budget_s + 180  # start-up allowance
        while True:
            metrics = swarm.metrics()
            if metrics and started is None:
                started = metrics[0]["elapsed_s"]
            if metrics and metrics[-1]["elapsed_s"] - started >= args.budget_s:
                break
            if learner.poll() is not None:
                raise SwarmError(f"learner exited {learner.returncode}; see {root}/learner.log")
            if time.monotonic() > deadline:
                raise SwarmError(f"the budget was not reached in time; see {root}")
            time.sleep(0.5)  # polling the learner's metrics file
        data_dir = str(root / "learner")
        peers = json.loads(swarm.run("learner", "echo_learner", "peers", "--json", "--data-dir", data_dir).stdout)
        status = json.loads(swarm.run("learner", "echo_learner", "status", "--json", "--data-dir", data_dir).stdout)
        codes = swarm.stop_all()
    if any(codes.values()):
        raise SwarmError(f"processes did not leave cleanly: {codes}")
    by_name = {p["name"]: p for p in peers}
    accepted = shares({n: p["rollouts"] for n, p in by_name.items()})
    throughput = shares({n: p["rollouts_per_s"] for n, p in by_name.items()})
    return {
        "expired_assignments": status["prompts_expired"],
        "assigned_share": shares({n: p["assigned"] for n, p in by_name.items()}),
        "accepted_share": accepted,
        "throughput_share": throughput,
        "share_gap": round(max(abs(accepted[n] - throughput[n]) for n in by_name), 4),
        "banned": sorted(n for n, p in by_name.items() if p["banned_for_s"] > 0),
        "learner_utilization": status["utilization"],
        "steps": status["step"],
        "rollouts_accepted": status["rollouts_accepted"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--speeds",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[2000.0, 500.0, 100.0, 100.0],
        help="each node's speed cap in tokens/s (default: 2000,500,100,100)",
    )
    parser.add_argument("--budget-s", type=float, default=90, help="seconds of training per run (default: 90)")
    parser.add_argument("--deadline-s", type=float, default=8, help="assignment deadline (default: 8)")
    parser.add_argument("--group-size", type=int, default=16, help="completions per prompt (default: 16)")
    parser.add_argument("--prompts-per-step", type=int, default=64, help="groups per step (default: 64)")
    parser.add_argument("--prompts-per-request", type=int, default=16, help="most prompts per assignment (default: 16)")
    parser.add_argument(
        "--mode",
        choices=("sync", "async"),
        default="sync",
        help="learner mode (default: sync: a step waits for its prompts, so a node holding "
        "more than it can finish stalls the learner)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    root = args.dir or Path(tempfile.mkdtemp(prefix="echo-heterogeneity-"))
    results = {}
    for name, sized in (("sized", True), ("fixed", False)):
        print(f"heterogeneity: {name} assignments for {args.budget_s:.0f} s ...", file=sys.stderr, flush=True)
        shutil.rmtree(root / name, ignore_errors=True)
        results[name] = run(sized, args, root / name)
    sized, fixed = results["sized"], results["fixed"]
    out = {
        "nodes": len(args.speeds),
        "speeds_tokens_per_s": args.speeds,
        "expired_assignments": sized["expired_assignments"],
        "assigned_share": sized["assigned_share"],
        "accepted_share": sized["accepted_share"],
        "throughput_share": sized["throughput_share"],
        "share_gap": sized["share_gap"],
        "learner_utilization": sized["learner_utilization"],
        "fixed_learner_utilization": fixed["learner_utilization"],
        "utilization_ratio": round(sized["learner_utilization"] / max(fixed["learner_utilization"], 1e-9), 3),
        "fixed_expired_assignments": fixed["expired_assignments"],
        "runs": results,
        "settings": {k: v for k, v in vars(args).items() if k not in ("dir", "json")},
    }
    out["met"] = {
        "expired_assignments": out["expired_assignments"] == 0,
        "share_gap": out["share_gap"] <= 0.1,
        "utilization_ratio": out["utilization_ratio"] >= 1.2,
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
