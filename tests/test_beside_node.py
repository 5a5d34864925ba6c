"""``echo-node doctor`` and ``echo-node credits`` run beside a working node,
with the same data dir, leave that node alone (real bootstrap, learner and
node processes on loopback)."""

import json
import time

import pytest

from echo_node import status


def node_status(swarm) -> dict:
    try:
        return status.read(swarm.root / "node0" / "status.json")
    except status.NotRunning:
        return {}


@pytest.mark.slow
def test_doctor_and_credits_beside_a_running_node_do_not_disturb_it(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    swarm.start_learner("--mode", "async", "--steps", "100000")
    swarm.start_node(0, "-v")  # a failed request is logged at info
    swarm.wait_until(lambda: node_status(swarm).get("batches_accepted", 0) >= 5, 180, "the node's first batches")
    # The condition under test, not a synchronisation: py-libp2p never
    # closes a connection in its first 20 s (its grace period), so the
    # node's connection to the learner must be older than that.
    working_since = time.monotonic()
    swarm.wait_until(lambda: time.monotonic() - working_since > 25, 60, "the node's connection to age")

    done = swarm.run(
        "node0",
        "echo_node",
        "doctor",
        "--json",
        "--bootstrap",
        swarm.bootstrap_addr,
        "--listen",
        swarm.listen,
        "--data-dir",
        str(swarm.root / "node0"),
        timeout_s=120,
    )
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and checks["learner"]["status"] == "ok", done.stdout + done.stderr
    assert "a node is running with this data dir" in checks.get("node", {}).get("detail", ""), (
        f"{done.stdout}\nnode0 exit code {swarm.procs['node0'].poll()}, status.json present: "
        f"{(swarm.root / 'node0' / 'status.json').exists()}\n" + (swarm.root / "node0.log").read_text()[-3000:]
    )

    # credits must speak as the node (the learner answers a peer with its own
    # receipts): a second connection under the node's peer id.
    done = swarm.run(
        "node0",
        "echo_node",
        "credits",
        "--json",
        "--bootstrap",
        swarm.bootstrap_addr,
        "--data-dir",
        str(swarm.root / "node0"),
        timeout_s=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["accepted"] >= 5

    # py-libp2p keeps one connection per peer: a second one under the node's
    # id made the learner close the node's own, at once, and the node lost
    # a request or two. Twenty more accepted batches span that.
    after = node_status(swarm)["batches_accepted"]
    swarm.wait_until(lambda: node_status(swarm).get("batches_accepted", 0) >= after + 20, 120, "more accepted batches")
    log = (swarm.root / "node0.log").read_text()
    for trouble in ("request to the learner failed", "lost the learner", "not delivered"):
        assert trouble not in log, log[-3000:]
