"""A stranger who announces a job with a validly signed junk manifest before
the real learner does stops no volunteer: ``echo-node join --bootstrap``
with no invite skips the decoy, joins the real job when it appears and gets
batches accepted; ``echo-node jobs`` lists both, the decoy failing its
checks. A node keeps to the job it worked for: restarted while its learner
is down, it waits for it rather than join another valid job, until told
another job (real bootstrap, decoy, learner and node processes on loopback)."""

import json
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from echo_node import status
from protocol.identity import load_or_create

ATTACKER = Path(__file__).resolve().parent.parent / "bench" / "attacker.py"


def start_decoy(swarm) -> str:
    """bench/attacker.py's decoy_jobs with one identity (whose model config
    lacks every size); returns its peer id once it has announced."""
    data = swarm.root / "decoy"
    proc = subprocess.Popen(
        [sys.executable, str(ATTACKER), "decoy_jobs", "--bootstrap", swarm.bootstrap_addr]
        + ["--data-dir", str(data), "--identities", "1", "--report-every-s", "1"],
        stdout=subprocess.PIPE,
        stderr=open(swarm.root / "decoy.log", "w"),
    )
    swarm.procs["decoy"] = proc  # stopped with the swarm
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        line = proc.stdout.readline().decode() if ready else ""
        assert line or proc.poll() is None, (swarm.root / "decoy.log").read_text()
        if json.loads(line or "{}").get("announced"):
            return load_or_create(data / "identity0" / "identity.key").peer_id_str
    raise AssertionError("the decoy did not announce within 60 s")


def accepted(swarm) -> int:
    try:
        return status.read(swarm.root / "node0" / "status.json").get("batches_accepted", 0)
    except status.NotRunning:
        return 0


def test_a_decoy_job_announced_first_stops_no_volunteer(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    decoy = start_decoy(swarm)
    # Only the decoy is listed while the node looks: the old node took it and exited.
    swarm.start_node(0, "--discovery-timeout-s", "600")
    log = swarm.root / "node0.log"
    swarm.wait_until(
        lambda: "skipping a job that fails its checks" in log.read_text(), 120, "the node to skip the decoy"
    )
    swarm.start_learner("--mode", "async", "--steps", "100000")
    swarm.wait_until(lambda: accepted(swarm) >= 2, 300, "the node's batches accepted")
    learner = load_or_create(swarm.root / "learner" / "identity.key").peer_id_str
    assert f"(learner {learner})" in log.read_text()

    done = swarm.run("jobs", "echo_node", "jobs", "--json", "--bootstrap", swarm.bootstrap_addr, timeout_s=120)
    assert done.returncode == 0, done.stderr
    jobs = {j["learner"]: j for j in json.loads(done.stdout)}
    assert set(jobs) == {decoy, learner}, done.stdout
    assert not jobs[decoy]["ok"] and "vocab_size" in jobs[decoy]["problem"], jobs[decoy]
    assert jobs[learner]["ok"] and jobs[learner]["nodes"] >= 1, jobs[learner]  # node0 works in it

    done = swarm.run("jobs", "echo_node", "jobs", "--bootstrap", swarm.bootstrap_addr, timeout_s=120)
    assert done.returncode == 0 and decoy in done.stdout and learner in done.stdout, done.stdout + done.stderr
    assert "vocab_size = None" in done.stdout


def test_a_node_keeps_to_the_job_it_worked_for(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    swarm.start_learner("--mode", "async", "--steps", "100000")
    swarm.start_node(0)
    swarm.wait_until(lambda: accepted(swarm) >= 1, 300, "the node's first batch accepted")
    log = swarm.root / "node0.log"
    job, learner = re.search(r"joined job (\S+) \(learner (\S+)\)", log.read_text()).groups()
    assert json.loads((swarm.root / "node0" / "job.json").read_text()) == {"job_id": job, "learner": learner}

    # Its learner goes down; another learner's valid job is the only one listed.
    assert swarm.stop("node0") == 0 and swarm.stop("learner") == 0
    del swarm.procs["learner"], swarm.procs["node0"]  # down: no longer watched
    other = swarm._spawn(
        "other",
        ["echo_learner", "run", "--bootstrap", swarm.bootstrap_addr, "--listen", swarm.listen]
        + ["--data-dir", str(swarm.root / "other"), "--mode", "async", "--steps", "100000"],
    )
    other_log = swarm.root / "other.log"
    swarm.wait_until(lambda: "status page" in other_log.read_text(), 300, "the other learner to start")
    other_job = re.search(r" job (\S+) \(async mode\)", other_log.read_text()).group(1)
    swarm.start_node(0, "--discovery-timeout-s", "5")
    swarm.wait_until(lambda: "still waiting for the learner" in log.read_text(), 120, "the node to wait")
    assert "joined job" not in log.read_text() and "waiting for the learner of the job" in log.read_text()
    assert learner in log.read_text()

    # Named on purpose, the other job is joined, and becomes the one it keeps to.
    assert swarm.stop("node0") == 0
    del swarm.procs["node0"]
    swarm.start_node(0, "--job-id", other_job)
    swarm.wait_until(lambda: f"joined job {other_job}" in log.read_text(), 180, "the node to join the other job")
    swarm.wait_until(
        lambda: json.loads((swarm.root / "node0" / "job.json").read_text())["job_id"] == other_job,
        300,
        "the node to remember the other job",
    )
    assert other.poll() is None
