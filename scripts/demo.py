"""``make demo``: a whole Echo Swarm on this machine, end to end.

One bootstrap peer, one learner and three volunteer nodes, each its own
process on 127.0.0.1, train the default model on the reverse task. Prints
progress while it runs and one summary line at the end; every process it
started is gone when it returns.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localswarm import SwarmError, local_swarm  # noqa: E402


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps (default: 150)")
    parser.add_argument("--nodes", type=int, default=3, help="volunteer nodes (default: 3)")
    parser.add_argument("--dir", type=Path, default=Path("demo-data"), help="logs and state")
    parser.add_argument("--timeout-s", type=float, default=600, help="give up after this long")
    args = parser.parse_args()

    shutil.rmtree(args.dir, ignore_errors=True)
    started = time.monotonic()
    with local_swarm(args.dir) as swarm:
        print(f"demo: starting bootstrap, learner and {args.nodes} nodes (logs in {args.dir}/)")
        addr = swarm.start_bootstrap()
        print(f"demo: bootstrap at {addr}")
        learner = swarm.start_learner("--steps", str(args.steps))
        for i in range(args.nodes):
            swarm.start_node(i)
        shown = -1
        page = ""
        while learner.poll() is None:
            api = args.dir / "learner" / "api.json"
            if not page and api.exists():
                page = json.loads(api.read_text())["url"]
                print(f"demo: status page: {page}", flush=True)
            if time.monotonic() - started > args.timeout_s:
                raise SwarmError(f"learner did not finish within {args.timeout_s:.0f} s")
            metrics = swarm.metrics()
            if metrics and metrics[-1]["step"] != shown:
                m = metrics[-1]
                shown = m["step"]
                recent = mean([x["reward_mean"] for x in metrics[-5:]])
                print(
                    f"demo: step {shown + 1:4d}/{args.steps}  version {m['version']:4d}  "
                    f"reward {recent:.3f}  rollouts {m['rollouts_accepted']:6d}  "
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
        f"reward_last={mean(rewards[-5:]):.3f}"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SwarmError as exc:
        print(f"demo: failed: {exc}", file=sys.stderr)
        sys.exit(1)
