"""Chunks between nodes behind different NATs: hole punched where the routers
allow it, relayed where they do not.

The seed (the learner's role in the broadcast) sits on the public segment;
``home1`` and ``home3`` are ordinary MASQUERADE routers, ``home2`` the strict
one (random port mapping). node1 fetches the weights while the seed is up;
then the seed stops, so node3 and node2 can only get them from node1 (or from
each other), across two NATs. Processes are bench/broadcast_peer.py, the
broadcast engine on its own with synthetic weights.
"""

from __future__ import annotations

import pytest
from localswarm import local_swarm
from netns import Topology, missing_tools
from swarmproc import Peer, wait_until

why_not = missing_tools()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(why_not), reason=f"NAT tests: {why_not}"),
]

LISTEN = "/ip4/0.0.0.0/tcp/4001"


def test_chunks_flow_hole_punched_between_masquerade_homes_and_relayed_to_the_strict_one(tmp_path):
    with Topology("es-hp") as net, local_swarm(tmp_path / "swarm") as swarm:
        net.public("boot", "10.77.0.2")
        net.public("seed", "10.77.0.3")
        net.host_in(net.home("home1", "10.77.0.11"), "node1")
        net.host_in(net.home("home2", "10.77.0.12", strict=True), "node2")
        net.host_in(net.home("home3", "10.77.0.13"), "node3")
        swarm.machine["bootstrap"] = net.prefix_argv("boot")
        bootstrap = swarm.start_bootstrap(listen="/ip4/0.0.0.0/tcp/4001")

        def peer(name: str, *args: str) -> Peer:
            return Peer(
                name,
                [
                    "--bootstrap",
                    bootstrap,
                    "--job-id",
                    "hp",
                    "--listen",
                    LISTEN,
                    "--data-dir",
                    str(tmp_path / name),
                    "--size-mib",
                    "4",
                    "--chunk-kib",
                    "256",
                    *args,
                ],
                tmp_path,
                machine=net.prefix_argv(name),
            )

        seed = peer("seed", "--role", "seed")
        peers = [seed]
        try:
            wait_until(peers, lambda: seed.last("ready"), 60)
            learner_id = seed.last("ready")["peer"]

            def node(name: str) -> Peer:
                p = peer(name, "--role", "node", "--learner-id", learner_id, "--behind-nat")
                peers.append(p)
                return p

            node1 = node("node1")
            wait_until(peers, lambda: (node1.last("neighbours") or {}).get("n", 0) >= 1, 60)
            seed.send("publish")
            wait_until(peers, lambda: node1.last("complete"), 120)
            seed.stop()  # from now on only NATed nodes hold the weights
            peers.remove(seed)

            node3, node2 = node("node3"), node("node2")
            wait_until(peers, lambda: node3.last("complete") and node2.last("complete"), 180)
        finally:
            for p in peers:
                p.stop()

        node1_id = node1.last("ready")["peer"]
        done3, done2 = node3.last("complete"), node2.last("complete")
        # node3 (behind the other MASQUERADE router) reached node1 through the
        # relay, punched a hole, and took the chunks over the direct connection
        # (two NATed peers have no other way to a direct one).
        assert done3["routes"][node1_id] == "direct", done3["routes"]
        assert set(done3["bytes_from"]) <= {node1_id, node2.last("ready")["peer"]}
        assert done3["bytes_from"].get(node1_id, 0) > 0, done3["bytes_from"]
        # The strict router maps ports at random: no hole, the relay carries it.
        relayed = [r for r in done2["routes"].values() if r != "gone"]
        assert relayed and all(r.startswith("relayed") for r in relayed), done2["routes"]
        assert sum(done2["bytes_from"].values()) >= 4 * 2**20, done2["bytes_from"]
