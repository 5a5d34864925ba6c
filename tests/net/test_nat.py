"""Echo Swarm across real NATs: Linux network namespaces built by the test.

One little internet for the whole module (scripts/netns.py): a public segment
with the bootstrap peer (which relays), the learner and a public node that
relays too (``--relay``, found by the others in the DHT);
two home routers doing MASQUERADE NAT and a strict one (random port mapping,
every unsolicited packet dropped), one node behind each. Every node is behind
NAT. Every process runs on its own namespaced machine, started with the
commands a user types, and the nodes join with nothing but the learner's
invite.

Needs root and ip/iptables/tc (``make test`` installs them when it runs as
root); otherwise the module is skipped with the reason.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from localswarm import local_swarm
from netns import Topology, missing_tools

why_not = missing_tools("miniupnpd", "iptables-legacy")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(why_not), reason=f"NAT tests: {why_not}"),
]

NODES = (1, 2, 3)  # node1 behind home1, node2 behind the strict home2, node3 behind home3


@pytest.fixture(scope="module")
def natted_swarm(tmp_path_factory):
    """The topology and a running job: bootstrap, learner, three invited nodes behind NAT."""
    root = tmp_path_factory.mktemp("nat")
    with Topology("es-nat") as net, local_swarm(root / "swarm") as swarm:
        net.public("boot", "10.77.0.2")
        net.public("learner", "10.77.0.3")
        net.public("pub", "10.77.0.4")
        net.host_in(net.home("home1", "10.77.0.11"), "node1")
        net.host_in(net.home("home2", "10.77.0.12", strict=True), "node2")
        net.host_in(net.home("home3", "10.77.0.13"), "node3")
        net.host_in(net.home("home4", "10.77.0.14", upnp=True), "upnp1")  # for the doctor only
        machines = ("learner", "pub", "node1", "node2", "node3", "upnp1")
        swarm.machine = {name: net.prefix_argv(name) for name in machines}
        swarm.machine["node0"] = net.prefix_argv("pub")
        swarm.machine["bootstrap"] = net.prefix_argv("boot")
        swarm.listen = "/ip4/0.0.0.0/tcp/0"
        swarm.start_bootstrap(listen=swarm.listen)
        swarm.start_learner("--mode", "async", "--steps", "100000", "--keep-versions", "2")
        invite = wait_for_invite(swarm)
        swarm.start_node(0, "--name", "relay0", "--relay", invite=invite)
        for i in NODES:
            # Re-checked every 5 s: under load a check can lose a server's
            # answer (two tries each), and the next one must then get it.
            swarm.start_node(i, "--name", f"node{i}", "--reachability-every-s", "5", invite=invite)
        yield net, swarm, invite


def wait_for_invite(swarm, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if swarm.procs["learner"].poll() is not None:
            pytest.fail("learner exited: " + (swarm.root / "learner.log").read_text()[-2000:])
        if (swarm.root / "learner" / "api.json").exists():
            done = swarm.run("learner", "echo_learner", "invite", "--data-dir", str(swarm.root / "learner"))
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()
        time.sleep(0.5)
    pytest.fail("the learner never started its API")


def node_status(swarm, i: int) -> dict | None:
    done = swarm.run(f"node{i}", "echo_node", "status", "--json", "--data-dir", str(swarm.root / f"node{i}"))
    return json.loads(done.stdout) if done.returncode == 0 else None


def wait_until(what: str, check, swarm, timeout_s: float = 180):
    """Poll ``check`` (a status read, not a timing assumption) until it is truthy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        for name, proc in swarm.procs.items():
            if proc.poll() is not None:
                pytest.fail(
                    f"{name} exited while waiting for {what}: " + (swarm.root / f"{name}.log").read_text()[-2000:]
                )
        time.sleep(1)
    logs = {n: (swarm.root / f"{n}.log").read_text()[-1500:] for n in swarm.procs if n.startswith("node")}
    pytest.fail(f"timed out waiting for {what}; node logs: {logs}")


def test_nodes_behind_nat_join_with_an_invite_and_know_whether_they_are_reachable(natted_swarm):
    net, swarm, invite = natted_swarm
    assert invite.startswith("echo1:")

    def everyone_settled():
        statuses = [node_status(swarm, i) for i in (0, *NODES)]
        settled = all(s and s["reachability"]["status"] != "unknown" and s["batches_accepted"] >= 1 for s in statuses)
        # The bootstrap and the learner both answered the natted nodes' latest check.
        answered = settled and all(
            set(s["reachability"]["answers"].values()) == {"could not dial us back"} for s in statuses[1:]
        )
        return statuses if answered else None

    relay0, *statuses = wait_until(
        "every node to check its reachability and get a batch accepted", everyone_settled, swarm
    )
    for status in statuses:
        assert status["reachability"]["status"] == "private", status["reachability"]
        assert status["job_id"] and status["learner"], status
        # The bootstrap and the learner both tried to dial back and failed.
        assert set(status["reachability"]["answers"].values()) == {"could not dial us back"}

    # Nodes behind NAT hold reservations on two relays, the bootstrap peer and
    # the public node that relays (found in the DHT), and advertise the
    # relayed addresses.
    boot_id = swarm.bootstrap_addr.rsplit("/p2p/", 1)[1]
    assert relay0["reachability"]["status"] == "public" and relay0["relay_reservations"] == []
    relays = {boot_id: "/ip4/10.77.0.2/", relay0["peer"]: "/ip4/10.77.0.4/"}

    def relayed():
        statuses = [node_status(swarm, i) for i in NODES]
        held = all({r["relay"] for r in s["relay_reservations"]} == set(relays) for s in statuses)
        return statuses if held else None

    statuses = wait_until("NATed nodes to hold reservations on both relays", relayed, swarm, timeout_s=120)
    for status in statuses:
        for reservation in status["relay_reservations"]:
            assert reservation["expires_in_s"] > 60
            circuit = f"/p2p/{reservation['relay']}/p2p-circuit/p2p/{status['peer']}"
            prefix = relays[reservation["relay"]]
            assert any(a.endswith(circuit) and a.startswith(prefix) for a in status["addrs"]), status["addrs"]

    # The learner's operator sees the same in `echo-learner peers`.
    done = swarm.run("learner", "echo_learner", "peers", "--json", "--data-dir", str(swarm.root / "learner"))
    assert done.returncode == 0, done.stderr
    peers = {p["name"]: p for p in json.loads(done.stdout)}
    for name in (f"node{i}" for i in NODES):
        assert peers[name]["reachability"] == "private", peers[name]
        assert peers[name]["route"] == "direct"  # every node dials the public learner itself
        assert peers[name]["accepted"] >= 1


def test_a_whole_round_runs_with_every_node_behind_nat(natted_swarm):
    """Weights out through the swarm, rollouts back, signed receipts in, with
    every node behind NAT; the nodes behind the two MASQUERADE routers reach
    each other by hole punching, the strict one only through the relay."""
    net, swarm, invite = natted_swarm
    before = {i: node_status(swarm, i) for i in NODES}

    def next_round():
        now = {i: node_status(swarm, i) for i in NODES}
        done = all(
            s and s["version"] > before[i]["version"] and s["batches_accepted"] > before[i]["batches_accepted"]
            for i, s in now.items()
        )
        return now if done else None

    wait_until("every node to take a newer version and get another batch accepted", next_round, swarm)

    def neighbours_settled():
        now = {i: node_status(swarm, i) for i in NODES}
        ids = {i: s["peer"] for i, s in now.items()}
        punched = now[1]["neighbours"].get(ids[3]) == "direct" or now[3]["neighbours"].get(ids[1]) == "direct"
        strict = [now[2]["neighbours"].get(ids[i]) for i in (1, 3)]
        return now if punched and all(r and r.startswith("relayed") for r in strict) else None

    wait_until(
        "node1 and node3 to hold a hole-punched connection, node2 relayed ones", neighbours_settled, swarm, timeout_s=90
    )


def test_a_tampered_invite_is_refused_before_anything_is_written(natted_swarm, tmp_path):
    net, swarm, invite = natted_swarm
    body = invite[len("echo1:") :]
    flipped = invite[: len("echo1:") + 40] + ("A" if body[40] != "A" else "B") + invite[len("echo1:") + 41 :]
    done = swarm.run("node1", "echo_node", "join", flipped, "--data-dir", str(tmp_path / "n"))
    assert done.returncode == 2
    assert "damaged or forged" in done.stderr
    assert not (tmp_path / "n").exists()


DEAD_BOOTSTRAP = "/ip4/10.77.0.99/tcp/4001/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp"


@pytest.fixture(scope="module")
def doctor_reports(natted_swarm, tmp_path_factory) -> dict[str, tuple[int, dict, Path]]:
    """``echo-node doctor --json`` in each situation, all at once (each run
    mostly waits on the network): name -> (exit code, report, its data dir)."""
    net, swarm, invite = natted_swarm
    root = tmp_path_factory.mktemp("doctor")
    runs = {machine: (machine, invite) for machine in ("pub", "node1", "node2", "upnp1")}
    runs["dead bootstrap"] = ("node1", "--bootstrap", DEAD_BOOTSTRAP, "--bootstrap-timeout-s", "3")

    def doctor(name: str) -> tuple[int, dict, Path]:
        machine, *args = runs[name]
        data_dir = root / name.replace(" ", "-")
        done = swarm.run(
            machine,
            "echo_node",
            "doctor",
            "--json",
            "--listen",
            "/ip4/0.0.0.0/tcp/0",
            "--data-dir",
            str(data_dir),
            *args,
            timeout_s=120,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout), data_dir

    with ThreadPoolExecutor(len(runs)) as pool:
        return dict(zip(runs, pool.map(doctor, runs)))


def by_name(report: dict) -> dict[str, dict]:
    """The report's checks by name (bootstrap may appear once per peer: the last wins)."""
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.parametrize(
    "machine, reachable, punch, upnp",
    [
        ("pub", "ok", "ok", "not needed"),  # a public machine
        ("node1", "warn", "ok", "no UPnP gateway"),  # behind MASQUERADE: NATed, hole punching works
        ("node2", "warn", "warn", "no UPnP gateway"),  # behind the strict router: only a relay reaches it
        ("upnp1", "ok", "ok", "your router forwards TCP"),  # behind a router that forwards on request
    ],
)
def test_doctor_tells_the_situations_apart(doctor_reports, machine, reachable, punch, upnp):
    code, report, data_dir = doctor_reports[machine]
    checks = by_name(report)
    assert code == 0 and report["ok"], report
    for name in ("backends", "bootstrap", "job", "learner", "relay", "memory", "disk", "upload"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "signature valid" in checks["job"]["detail"]
    assert "direct connection" in checks["learner"]["detail"]
    assert checks["reachable"]["status"] == reachable, checks["reachable"]
    assert checks["hole punch"]["status"] == punch, checks["hole punch"]
    assert upnp in checks["upnp"]["detail"], checks["upnp"]
    assert checks["upnp"]["status"] == ("warn" if upnp == "no UPnP gateway" else "ok")
    if reachable == "warn":
        assert "behind NAT" in checks["reachable"]["detail"] and checks["reachable"]["fix"]
    assert not data_dir.exists()  # the doctor writes nothing


def test_doctor_fails_clearly_when_the_bootstrap_is_unreachable(doctor_reports):
    code, report, _ = doctor_reports["dead bootstrap"]
    checks = by_name(report)
    assert code == 1 and not report["ok"]
    assert checks["bootstrap"]["status"] == "fail"
    assert "does not answer" in checks["bootstrap"]["detail"] and checks["bootstrap"]["fix"]
    assert checks["job"]["status"] == "fail"


def learner_peers(swarm) -> dict[str, dict] | None:
    done = swarm.run("learner", "echo_learner", "peers", "--json", "--data-dir", str(swarm.root / "learner"))
    return {p["name"]: p for p in json.loads(done.stdout)} if done.returncode == 0 else None


def test_natted_nodes_find_a_learner_restarted_on_another_machine(natted_swarm):
    """Runs last: it kills the learner. Nodes are not restarted or told anything."""
    net, swarm, invite = natted_swarm
    wait_until("the learner's first checkpoint", lambda: (swarm.root / "learner" / "checkpoint.pt").exists(), swarm)
    learner = swarm.procs["learner"]
    learner.kill()  # a crash: no goodbye, api.json left behind
    learner.wait()
    net.public("learner2", "10.77.0.5")
    swarm.machine["learner"] = net.prefix_argv("learner2")
    swarm.start_learner("--mode", "async", "--steps", "100000", "--resume")

    def natted_nodes_back():
        peers = learner_peers(swarm)  # the new process knows only who reached it
        back = peers and all(peers.get(n, {}).get("accepted", 0) >= 1 for n in ("node1", "node2"))
        return peers if back else None

    peers = wait_until("the NATed nodes to deliver to the restarted learner", natted_nodes_back, swarm)
    assert peers["node1"]["reachability"] == "private"
    # Nodes learn the new address from the learner's fresh DHT provider
    # records: re-looking it up after failed requests, or through the
    # broadcast's neighbour discovery, whichever comes first.
