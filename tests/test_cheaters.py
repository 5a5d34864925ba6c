"""Cheating nodes in a real swarm: the project's own node with one thing
changed (bench/cheats.py), beside an honest one, against a real learner.

A llama.cpp node that runs Q4_0 while declaring q8_0 passes every per-batch
bound on the built-in model; one that samples with llama.cpp's chat defaults
(top-k 40, top-p 0.95) reports exact log-probs. Both must be caught by the
evidence over their batches, refused from then on, and lose their credit,
which ``echo-learner ledger`` shows; the honest node is never refused, and a
restarted learner still refuses the caught peers.
"""

import json
import sqlite3
from pathlib import Path

import pytest
from swarmproc import free_port

from echo_learner.verify.evidence import PRECISION_MISMATCH, SAMPLER_MISMATCH
from echo_learner.verify.verifier import STRIKES
from echo_node.backend_choice import llama_installed
from protocol.identity import load_or_create

pytestmark = pytest.mark.skipif(
    not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)"
)
CHEATS = str(Path(__file__).resolve().parent.parent / "bench" / "cheats.py")
NODE = ("--backend", "llama", "--dtype", "q8_0", "--threads", "1", "-v")  # -v: a failure's logs say why
LEARNER = (
    "--group-size", "8", "--prompts-per-step", "8", "--prompts-per-request", "1", "--torch-threads", "1",
    "--strikes-to-ban", "1000",  # no bans: the caught cheaters go on sending, for the restarted learner to refuse
)  # fmt: skip


def verdicts(ledger: Path) -> list[tuple[str, str, str]]:
    if not ledger.exists():
        return []
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        return db.execute("SELECT peer, verdict, reason FROM verdicts ORDER BY id").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def start_learner(swarm, port, *extra):
    """A learner on a fixed port (the same after a restart, as an operator runs it)."""
    listen = f"/ip4/127.0.0.1/tcp/{port}"
    data_dir = str(swarm.root / "learner")
    args = ["echo_learner", "run", "--bootstrap", swarm.bootstrap_addr, "--listen", listen, "--data-dir", data_dir]
    return swarm._spawn("learner", [*args, *LEARNER, *extra])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cheaters_are_caught_and_forfeit_their_credit_while_the_honest_node_keeps_its(swarm_factory):
    swarm = swarm_factory
    peer = {i: load_or_create(swarm.root / f"node{i}" / "identity.key").peer_id_str for i in range(3)}
    swarm.start_bootstrap()
    port = free_port()
    start_learner(swarm, port)
    swarm.start_node(0, *NODE, "--name", "honest")
    swarm.start_node(1, *NODE, "--name", "q4_0", program=(CHEATS, "q4_0", "--"))
    swarm.start_node(2, *NODE, "--name", "chat", program=(CHEATS, "chat_sampler", "--"))
    ledger, log = swarm.root / "learner" / "ledger.sqlite", swarm.root / "learner.log"

    def refused(i):
        """Why ``i``'s batches were refused for what an honest node never
        does: a batch made with a version the window has since left is
        refused too, and the slow chat-sampler node can meet that first."""
        return [r[2] for r in verdicts(ledger) if r[0] == peer[i] and r[1] == "refused" and r[2] in STRIKES]

    def accepted(i):
        return sum(r[0] == peer[i] and r[1] == "accepted" for r in verdicts(ledger))

    def trained():  # a step taken: the learner has a checkpoint to resume from when it stops
        metrics = swarm.root / "learner" / "metrics.jsonl"
        return metrics.exists() and metrics.read_text().strip() != ""

    swarm.wait_until(
        lambda: refused(1) and refused(2) and accepted(0) >= 3 and trained(),
        420,
        "both cheaters refused, the honest node's batches accepted and trained on",
    )
    assert refused(1)[0] == PRECISION_MISMATCH and refused(2)[0] == SAMPLER_MISMATCH
    assert not refused(0)
    assert log.read_text().count("caught cheating") == 2  # once each, however many batches were in flight
    assert swarm.stop("learner") == 0

    board = swarm.run("learner", "echo_learner", "ledger", "--data-dir", str(swarm.root / "learner"), "--json")
    assert board.returncode == 0, board.stderr
    standing = {c["peer"]: c for c in json.loads(board.stdout)["contributors"]}
    assert standing[peer[0]]["credit"] > 0 and standing[peer[0]]["forfeited"] == 0
    for i in (1, 2):
        assert standing[peer[i]]["credit"] == 0, standing[peer[i]]

    # A restarted learner still knows them: their next batches are refused
    # at once, for the reason they were caught.
    seen = {i: len(refused(i)) for i in (1, 2)}
    start_learner(swarm, port, "--resume")
    swarm.wait_until(
        lambda: all(len(refused(i)) > seen[i] for i in (1, 2)),
        300,
        "the cheaters' batches refused by the restarted learner",
    )
    for i, reason in ((1, PRECISION_MISMATCH), (2, SAMPLER_MISMATCH)):
        after = refused(i)[seen[i] :]
        assert after == [reason] * len(after), after
