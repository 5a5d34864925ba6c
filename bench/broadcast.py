"""Broadcast benchmark: pipelined swarm vs its bound, real processes on loopback.

One seed holds a synthetic model of ``--size-mib`` MiB; ``--nodes`` nodes
fetch it; every process's upload is capped at ``--upload-mbit``. With all
processes running and connected, it times from the seed's announcement until
every node holds and has verified the version:

- ``pipelined_s``: the real broadcast;
- ``stalling_s``: the same with ``--stalling`` extra peers that announce every
  chunk, accept requests and never send a byte;
- ``star_s`` (unless ``--skip-star``): relaying off, every node downloads from
  the seed only;
- ``sim_s``: bench/broadcast_sim.py at the same settings (1 ms latency), to
  keep the simulator honest.

``bound_s`` is size / upload rate, the time the seed needs to upload one copy:
with equal links the Kumar-Ross bound, since the nodes' total upload exceeds
the seed's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from broadcast_sim import parse_args as sim_args  # noqa: E402
from broadcast_sim import simulate
from harness import print_result  # noqa: E402
from localswarm import local_swarm  # noqa: E402
from swarmproc import Peer, keep_logs, wait_until  # noqa: E402


def run_once(root: Path, bootstrap: str, args: argparse.Namespace, relay: bool, stalling: int = 0) -> dict:
    mode = ("pipelined" if relay else "star") + (f"-stalling{stalling}" if stalling else "")
    common = [
        "--bootstrap",
        bootstrap,
        "--job-id",
        f"bench-{mode}",
        "--upload-mbit",
        str(args.upload_mbit),
        "--chunk-kib",
        str(args.chunk_kib),
    ]
    seed = Peer(
        f"{mode}-seed",
        ["--role", "seed", "--data-dir", str(root / f"{mode}-seed"), "--size-mib", str(args.size_mib), *common],
        root,
    )
    peers = [seed]
    try:
        wait_until([seed], lambda: seed.last("ready") is not None, 60)
        learner_id = seed.last("ready")["peer"]
        nodes = [
            Peer(
                f"{mode}-node{i}",
                [
                    "--role",
                    "node",
                    "--data-dir",
                    str(root / f"{mode}-node{i}"),
                    "--learner-id",
                    learner_id,
                    *common,
                    *([] if relay else ["--no-relay"]),
                ],
                root,
            )
            for i in range(args.nodes)
        ]
        peers += nodes
        stallers = [
            Peer(
                f"{mode}-staller{i}",
                [
                    "--role",
                    "node",
                    "--data-dir",
                    str(root / f"{mode}-staller{i}"),
                    "--learner-id",
                    learner_id,
                    "--stall",
                    *common,
                ],
                root,
            )
            for i in range(stalling)
        ]
        peers += stallers
        # Connected: every node sees the seed and the other nodes (up to its peer limit).
        want = min(args.nodes + stalling, 16)
        wait_until(peers, lambda: all((n.last("neighbours") or {}).get("n", 0) >= want for n in nodes), 120)
        cpu_before = {n.name: n.last("neighbours")["cpu_s"] for n in nodes}
        seed.send("publish")
        wait_until(peers, lambda: all(n.last("complete") for n in nodes) and seed.last("published"), args.timeout_s)
        t0 = seed.last("published")["t"]
        times = sorted(n.last("complete")["t"] - t0 for n in nodes)
        from_seed = sum(n.last("complete")["bytes_from"].get(learner_id, 0) for n in nodes)
        total = sum(sum(n.last("complete")["bytes_from"].values()) for n in nodes)
        node_cpu = sum(n.last("complete")["cpu_s"] - cpu_before[n.name] for n in nodes)
        return {
            "s": times[-1],
            "p50_s": times[len(times) // 2],
            "seed_share": from_seed / total,
            "node_cpu_s": node_cpu,
        }
    finally:
        for p in peers:
            p.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--size-mib", type=float, default=32)
    parser.add_argument("--upload-mbit", type=float, default=20)
    parser.add_argument("--chunk-kib", type=int, default=256)
    parser.add_argument(
        "--stalling",
        type=int,
        default=4,
        help="extra peers that announce every chunk and never send one (0: no such run)",
    )
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--skip-star", action="store_true", help="no star run")
    parser.add_argument("--skip-sim", action="store_true", help="no simulator run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy process logs here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="echo-bench-"))
    try:
        with local_swarm(root) as swarm:
            bootstrap = swarm.start_bootstrap()
            pipelined = run_once(root, bootstrap, args, relay=True)
            stalling = run_once(root, bootstrap, args, relay=True, stalling=args.stalling) if args.stalling else None
            star = None if args.skip_star else run_once(root, bootstrap, args, relay=False)
    finally:
        keep_logs(root, args.keep_logs)
        shutil.rmtree(root, ignore_errors=True)
    bound_s = args.size_mib * 2**20 * 8 / (args.upload_mbit * 1e6)
    result = {
        "nodes": args.nodes,
        "size_mib": args.size_mib,
        "upload_mbit": args.upload_mbit,
        "chunk_kib": args.chunk_kib,
        "bound_s": round(bound_s, 3),
        "pipelined_s": round(pipelined["s"], 3),
        "pipelined_p50_s": round(pipelined["p50_s"], 3),
        "pipelined_over_bound": round(pipelined["s"] / bound_s, 3),
        "pipelined_seed_share": round(pipelined["seed_share"], 3),
        "pipelined_node_cpu_s": round(pipelined["node_cpu_s"], 2),
    }
    if stalling is not None:
        result["stalling_peers"] = args.stalling
        result["stalling_s"] = round(stalling["s"], 3)
        result["stalling_over_bound"] = round(stalling["s"] / bound_s, 3)
    if star is not None:
        result["star_s"] = round(star["s"], 3)
        result["star_over_pipelined"] = round(star["s"] / pipelined["s"], 3)
    if not args.skip_sim:
        sim = simulate(
            sim_args(
                [
                    "--only",
                    "--nodes",
                    str(args.nodes),
                    "--size-mib",
                    str(args.size_mib),
                    "--chunk-kib",
                    str(args.chunk_kib),
                    "--upload-mbit",
                    str(args.upload_mbit),
                    "--latency-ms",
                    "1",
                ]
            )
        )
        result["sim_s"] = sim["p100_s"]
        result["sim_over_pipelined"] = round(sim["p100_s"] / pipelined["s"], 3)
    print_result(result, args.json)


if __name__ == "__main__":
    main()
