"""NAT benchmark: one version broadcast to nodes that are all public, then to
nodes that are mostly behind home routers.

It builds a little internet of Linux network namespaces (scripts/netns.py):
a public segment with the bootstrap peer (which relays) and the seed (the
learner's role in the broadcast), and for each run ``--nodes`` nodes, every
machine's upload capped by ``tc`` at ``--upload-mbit``. Run 1: every node
public. Run 2: two public, the others behind MASQUERADE home routers, of which
``--strict`` behind strict ones (random port mapping: no hole punch, only the
relay). Each run times from the seed's announcement until every node holds
and has verified the version (bench/broadcast_peer.py processes).

Figures: ``public_s``, ``natted_s`` and their ratio (target ≤ 1.3); for the
NATed run, ``direct_pairs`` / ``relayed_pairs`` (connected pairs of peers by
route), ``hole_punch_success`` (punches that ended direct ÷ punches) and the
same between the MASQUERADE homes alone (target 1.0). ``bound_s`` is size ÷
upload, the time the seed needs to send one copy. Needs root, ip, iptables, tc.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import print_result  # noqa: E402
from localswarm import local_swarm  # noqa: E402
from netns import Topology, missing_tools  # noqa: E402
from swarmproc import Peer, keep_logs, wait_until  # noqa: E402

LISTEN = "/ip4/0.0.0.0/tcp/4001"


def build_machines(net: Topology, run: str, kinds: list[str], first_ip: int, mbit: float) -> list[str]:
    """One machine per node: ``public``, ``home`` (MASQUERADE) or ``strict``."""
    names = []
    for i, kind in enumerate(kinds):
        name, wan_ip = f"{run}{i}", f"10.77.0.{first_ip + i}"
        if kind == "public":
            net.public(name, wan_ip)
        else:
            net.host_in(net.home(f"{run}h{i}", wan_ip, strict=kind == "strict"), name)
        net.cap_upload(name, mbit)
        names.append(name)
    return names


def run_once(
    net: Topology, bootstrap: str, root: Path, args: argparse.Namespace, run: str, kinds: list[str], first_ip: int
) -> dict:
    names = build_machines(net, run, kinds, first_ip, args.upload_mbit)
    seed_machine = f"{run}seed"
    net.public(seed_machine, f"10.77.0.{first_ip - 1}")
    net.cap_upload(seed_machine, args.upload_mbit)

    def peer(name: str, machine: str, *extra: str) -> Peer:
        return Peer(
            name,
            [
                "--bootstrap",
                bootstrap,
                "--job-id",
                f"nat-{run}",
                "--listen",
                LISTEN,
                "--data-dir",
                str(root / name),
                "--size-mib",
                str(args.size_mib),
                "--chunk-kib",
                str(args.chunk_kib),
                *extra,
            ],
            root,
            machine=net.prefix_argv(machine),
        )

    seed = peer(f"{run}-seed", seed_machine, "--role", "seed")
    peers = [seed]
    try:
        wait_until(peers, lambda: seed.last("ready"), 60)
        seed_id = seed.last("ready")["peer"]
        nodes = [
            peer(
                f"{run}-node{i}",
                name,
                "--role",
                "node",
                "--learner-id",
                seed_id,
                *(["--behind-nat"] if kind != "public" else []),
            )
            for i, (name, kind) in enumerate(zip(names, kinds))
        ]
        peers += nodes
        # Connected: every node has a have-stream with the seed and every other
        # node (through relays and hole punches in the NATed run).
        want = len(nodes)
        wait_until(
            peers, lambda: all((n.last("neighbours") or {}).get("n", 0) >= want for n in nodes), args.connect_timeout_s
        )
        seed.send("publish")
        wait_until(peers, lambda: all(n.last("complete") for n in nodes) and seed.last("published"), args.timeout_s)
    finally:
        for p in peers:
            p.stop()
    t0 = seed.last("published")["t"]
    times = sorted(n.last("complete")["t"] - t0 for n in nodes)
    ids = {n.last("ready")["peer"]: kind for n, kind in zip(nodes, kinds)}
    ids[seed_id] = "public"
    routes: dict[frozenset, set[str]] = {}
    punches: list[tuple[str, str, bool]] = []
    for n in nodes:
        me = n.last("ready")["peer"]
        done = n.last("complete")
        for other, route in done["routes"].items():
            routes.setdefault(frozenset((me, other)), set()).add("direct" if route == "direct" else "relayed")
        punches += [(me, other, ok) for other, ok in done["punches"].items()]
    masq = [ok for a, b, ok in punches if ids.get(a) == "home" and ids.get(b) == "home"]
    by_kind: dict[str, float] = {}
    for n, kind in zip(nodes, kinds):
        by_kind[kind] = max(by_kind.get(kind, 0.0), n.last("complete")["t"] - t0)
    return {
        "s": times[-1],
        "s_by_kind": {k: round(v, 3) for k, v in by_kind.items()},
        "p50_s": times[len(times) // 2],
        "direct_pairs": sum(1 for r in routes.values() if "direct" in r),
        "relayed_pairs": sum(1 for r in routes.values() if "direct" not in r),
        "punches": len(punches),
        "hole_punch_success": sum(ok for _, _, ok in punches) / len(punches) if punches else None,
        "masquerade_punches": len(masq),
        "masquerade_punch_success": sum(masq) / len(masq) if masq else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--natted", type=int, default=6, help="nodes behind NAT in the second run")
    parser.add_argument("--strict", type=int, default=2, help="of those, behind strict routers")
    parser.add_argument("--size-mib", type=float, default=32)
    parser.add_argument("--upload-mbit", type=float, default=20)
    parser.add_argument("--chunk-kib", type=int, default=512)
    parser.add_argument("--connect-timeout-s", type=float, default=180)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy process logs here")
    args = parser.parse_args()
    if why := missing_tools():
        parser.error(f"cannot build the test network: {why}")
    if not 0 <= args.strict <= args.natted <= args.nodes:
        parser.error("need 0 <= --strict <= --natted <= --nodes")

    public_kinds = ["public"] * args.nodes
    natted_kinds = (
        ["public"] * (args.nodes - args.natted) + ["home"] * (args.natted - args.strict) + ["strict"] * args.strict
    )
    root = Path(tempfile.mkdtemp(prefix="echo-bench-nat-"))
    try:
        with Topology("es-bn") as net, local_swarm(root / "swarm") as swarm:
            net.public("boot", "10.77.0.2")
            swarm.machine["bootstrap"] = net.prefix_argv("boot")
            bootstrap = swarm.start_bootstrap(listen=LISTEN)
            public = run_once(net, bootstrap, root, args, "p", public_kinds, 11)
            natted = run_once(net, bootstrap, root, args, "n", natted_kinds, 11 + args.nodes + 2)
    finally:
        keep_logs(root, args.keep_logs)
        shutil.rmtree(root, ignore_errors=True)

    def r(x):
        return None if x is None else round(x, 3)

    result = {
        "nodes": args.nodes,
        "natted": args.natted,
        "strict": args.strict,
        "size_mib": args.size_mib,
        "upload_mbit": args.upload_mbit,
        "bound_s": r(args.size_mib * 2**20 * 8 / (args.upload_mbit * 1e6)),
        "public_s": r(public["s"]),
        "natted_s": r(natted["s"]),
        "natted_over_public": r(natted["s"] / public["s"]),
        "public_p50_s": r(public["p50_s"]),
        "natted_p50_s": r(natted["p50_s"]),
        "natted_s_by_kind": natted["s_by_kind"],
        "direct_pairs": natted["direct_pairs"],
        "relayed_pairs": natted["relayed_pairs"],
        "punches": natted["punches"],
        "hole_punch_success": r(natted["hole_punch_success"]),
        "masquerade_punches": natted["masquerade_punches"],
        "masquerade_punch_success": r(natted["masquerade_punch_success"]),
    }
    print_result(result, args.json)


if __name__ == "__main__":
    main()
