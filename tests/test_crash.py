"""SIGKILL the learner mid-run with nodes attached; restart it with --resume.

Proves: no receipt-acknowledged batch and no ledger row is lost, training
continues from the last checkpoint, the nodes reconnect by themselves. While
the swarm runs it also checks the operator's view (the HTTP API, ``status``,
``peers``) and a node's ``credits``; afterwards ``export``.
"""

import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

from protocol import codec
from protocol.identity import load_or_create, verify
from protocol.wire.rollout import Receipt, RolloutBatch

CHECKPOINT_EVERY = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s, what, proc=None, log=None):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited {proc.returncode}: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)  # polling files written by other processes


def node_receipts(swarm, i):
    path = swarm.root / f"node{i}" / "receipts.jsonl"
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [codec.decode(bytes.fromhex(json.loads(line)["receipt"]), Receipt) for line in lines]


def ledger_rows(swarm):
    db = sqlite3.connect(swarm.root / "learner" / "ledger.sqlite")
    try:
        return db.execute("SELECT id, batch_hash, verdict, batch FROM verdicts ORDER BY id").fetchall()
    finally:
        db.close()


def cli(*args):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_learner_survives_sigkill_and_resumes(swarm_factory, tmp_path):
    swarm = swarm_factory
    swarm.start_bootstrap()
    port = free_port()
    args = ("--mode", "async", "--staleness", "2", "--steps", "100000", "--checkpoint-every", str(CHECKPOINT_EVERY))
    # The same address after the restart, as an operator would run it.
    learner = swarm._spawn(
        "learner",
        [
            "echo_learner",
            "run",
            "--bootstrap",
            swarm.bootstrap_addr,
            "--listen",
            f"/ip4/127.0.0.1/tcp/{port}",
            "--data-dir",
            str(swarm.root / "learner"),
            *args,
        ],
    )
    for i in range(2):
        swarm.start_node(i)
    log = swarm.root / "learner.log"
    wait_until(lambda: len(swarm.metrics()) >= 3 * CHECKPOINT_EVERY + 2, 300, "steps", learner, log)

    # --- the operator's view of the running learner ---------------------------------
    data_dir = str(swarm.root / "learner")
    url = json.loads((swarm.root / "learner" / "api.json").read_text())["url"].rstrip("/")
    status = json.loads(cli("-m", "echo_learner", "status", "--data-dir", data_dir, "--json"))
    assert status["mode"] == "async" and status["staleness"] == 2 and status["step"] >= 15
    assert 0 < status["utilization"] <= 1 and status["capacity"]["supply_rollouts_per_s"] > 0
    node_ids = {load_or_create(swarm.root / f"node{i}" / "identity.key").peer_id_str for i in range(2)}
    peers = json.loads(cli("-m", "echo_learner", "peers", "--data-dir", data_dir, "--json"))
    assert node_ids <= {p["peer"] for p in peers if p["accepted"] > 0}
    # What each node runs on, as it reports it (this machine has no GPU).
    for p in peers:
        assert p["device"] == "cpu" and p["memory_mib"] > 0 and p["tokens_per_s"] > 0, p
    text = cli("-m", "echo_learner", "status", "--data-dir", data_dir)
    assert "utilization" in text and f"bootstrap  {swarm.bootstrap_addr}: answers (" in text
    for path, key in (
        ("/api/history?limit=5", "steps"),
        ("/api/ledger", "contributors"),
        (f"/api/receipts?peer={min(node_ids)}", "receipts"),
    ):
        code, body = get(url + path)
        assert code == 200 and body[key], path
    assert get(url + "/api/refusals") == (200, {"refusals": []})  # only honest nodes here
    assert len(get(url + "/api/history?limit=5")[1]["steps"]) == 5
    assert get(url + "/api/nothing")[0] == 404
    assert get(url + "/api/ledger?limit=zero")[0] == 400
    assert get(url + "/api/receipts")[0] == 400

    # --- kill -9 ---------------------------------------------------------------------
    learner.send_signal(signal.SIGKILL)
    learner.wait()
    steps_before = swarm.metrics()
    rows_before = ledger_rows(swarm)
    receipts_before = [r for i in range(2) for r in node_receipts(swarm, i)]
    killed_at_version = steps_before[-1]["version"]
    checkpoint = torch.load(swarm.root / "learner" / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] % CHECKPOINT_EVERY == 0 and checkpoint["step"] <= len(steps_before)
    print(
        f"killed at step {len(steps_before)}, version {killed_at_version}; "
        f"checkpoint step {checkpoint['step']}; ledger rows {len(rows_before)}; "
        f"receipts held by nodes {len(receipts_before)}"
    )

    # --- restart with --resume ---------------------------------------------------------
    restarted = time.monotonic()
    learner = swarm._spawn(
        "learner",
        [
            "echo_learner",
            "run",
            "--bootstrap",
            swarm.bootstrap_addr,
            "--listen",
            f"/ip4/127.0.0.1/tcp/{port}",
            "--data-dir",
            data_dir,
            "--resume",
            *args,
        ],
    )
    log = swarm.root / "learner.log"

    def both_nodes_back():
        return all(
            any(r.version > killed_at_version and r.verdict == "accepted" for r in node_receipts(swarm, i))
            for i in range(2)
        )

    wait_until(both_nodes_back, 300, "both nodes to work for the restarted learner", learner, log)
    reconnect_s = time.monotonic() - restarted
    wait_until(lambda: len(swarm.metrics()) >= len(steps_before) + 5, 300, "steps after resume", learner, log)

    # Training continued from the checkpoint: the first step after the restart
    # is the one after the checkpoint, with a version number never used before.
    after = swarm.metrics()[len(steps_before) :]
    assert after[0]["step"] == checkpoint["step"]
    assert after[0]["version"] > killed_at_version

    # A node's credits, fetched from the restarted learner, cover its receipts
    # from before the crash, each signature checked.
    before0 = node_receipts(swarm, 0)
    credits = json.loads(
        cli(
            "-m",
            "echo_node",
            "credits",
            "--bootstrap",
            swarm.bootstrap_addr,
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--data-dir",
            str(swarm.root / "node0"),
            "--json",
        )
    )
    assert credits["receipts"] >= len(before0) and credits["signatures_checked"] == credits["receipts"]
    assert credits["credit"] >= sum(r.credit for r in before0 if r.verdict == "accepted") > 0

    codes = swarm.stop_all()
    assert set(codes.values()) == {0}, codes
    # A clean stop (Ctrl-C) loses no training: the checkpoint written on the
    # way out holds every step trained, not just those up to the last
    # --checkpoint-every.
    trained = swarm.metrics()[-1]["step"] + 1
    assert torch.load(swarm.root / "learner" / "checkpoint.pt", weights_only=True)["step"] >= trained

    # Nothing acknowledged was lost: every row from before the kill is still
    # there, and every receipt any node holds has its row, with the batch.
    rows = ledger_rows(swarm)
    assert [r[:3] for r in rows[: len(rows_before)]] == [r[:3] for r in rows_before]
    by_hash = {bytes(h): (verdict, batch) for _, h, verdict, batch in rows}
    receipts = [r for i in range(2) for r in node_receipts(swarm, i)]
    assert len(receipts) > len(receipts_before)
    for r in receipts:
        verify(r, r.learner_id)
        verdict, batch = by_hash[r.batch_hash]
        assert verdict == r.verdict
        if verdict == "accepted":
            assert codec.digest(codec.decode(batch, RolloutBatch)) == r.batch_hash
    print(f"restart: nodes back after {reconnect_s:.1f} s; ledger rows {len(rows)}; receipts {len(receipts)}")

    # The trained model leaves as a Hugging Face directory.
    out = tmp_path / "exported"
    cli("-m", "echo_learner", "export", str(out), "--data-dir", data_dir)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    final = torch.load(swarm.root / "learner" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in final.items())
    assert AutoTokenizer.from_pretrained(out)("ab=", add_special_tokens=False)["input_ids"] == [97, 98, 61]
