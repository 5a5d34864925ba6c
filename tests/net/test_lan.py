"""On one LAN nothing needs configuring: mDNS (tests/net/: a bridge of namespaced machines).

A learner and two nodes on one bridge, none given a bootstrap address: the
nodes are started with no flags at all (their data dirs come from HOME, as
on a fresh machine) and must find the learner and get work accepted. A node
on a LAN with no learner says in one line what to do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from localswarm import local_swarm
from netns import Topology, missing_tools

why_not = missing_tools()
pytestmark = [pytest.mark.skipif(bool(why_not), reason=f"LAN tests: {why_not}")]


def test_nodes_on_one_lan_join_with_no_flags(tmp_path):
    with Topology("es-lan") as net, local_swarm(tmp_path / "swarm") as swarm:
        for i, name in enumerate(("learner", "node0", "node1")):
            net.public(name, f"10.77.0.{i + 3}")
        swarm.machine = {name: net.prefix_argv(name) for name in ("learner", "node0", "node1")}
        swarm._spawn(
            "learner",
            ["echo_learner", "run", "--mode", "async", "--steps", "100000", "--data-dir", str(tmp_path / "learner")],
        )
        for i in range(2):
            home = tmp_path / f"home{i}"
            home.mkdir()
            swarm._spawn(f"node{i}", ["echo_node", "join"], env={"HOME": str(home)})

        def accepted(i):
            path = tmp_path / f"home{i}" / ".echo-swarm" / "node" / "status.json"
            return path.exists() and json.loads(path.read_text())["batches_accepted"] >= 1

        deadline = time.monotonic() + 180
        while not all(accepted(i) for i in range(2)):
            for name, proc in swarm.procs.items():
                assert proc.poll() is None, (swarm.root / f"{name}.log").read_text()[-2000:]
            assert time.monotonic() < deadline, [(swarm.root / f"node{i}.log").read_text()[-1500:] for i in range(2)]
            time.sleep(1)
        log = (swarm.root / "node0.log").read_text()
        assert "looking for a learner on the local network" in log


def test_a_node_alone_on_a_lan_says_what_to_do(tmp_path):
    with Topology("es-lan") as net:
        net.public("node0", "10.77.0.3")
        done = subprocess.run(
            [
                *net.prefix_argv("node0"),
                sys.executable,
                "-m",
                "echo_node",
                "join",
                "--mdns",
                "--lan-wait-s",
                "3",
                "--data-dir",
                str(tmp_path / "n"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    error = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "no learner answered on the local network" in error[0], done.stderr
    assert "echo-node join echo1:" in error[0]
