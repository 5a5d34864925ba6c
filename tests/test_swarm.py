"""A real swarm: bootstrap, learner and two nodes as separate processes on loopback."""

import json
import sqlite3
from pathlib import Path

from protocol import codec
from protocol.identity import verify
from protocol.wire.rollout import Receipt

STEPS = 60


def mean(xs):
    return sum(xs) / len(xs)


def thread_nices(pid: int) -> dict[int, int]:
    """Each thread's nice value (field 19 of /proc/PID/task/TID/stat, after the command's parentheses)."""
    nices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        nices[int(task.name)] = int(fields[16])
    return nices


def test_swarm_trains_and_every_accepted_batch_has_a_receipt(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    learner = swarm.start_learner("--steps", str(STEPS))
    swarm.start_node(0)
    swarm.start_node(1)
    # Training and recompute run below the event loop's priority (--model-work-nice, 10 by default).
    swarm.wait_until(lambda: 10 in thread_nices(learner.pid).values(), 300, "a learner thread at nice 10")
    assert thread_nices(learner.pid)[learner.pid] == 0  # the event loop's thread keeps its priority
    assert learner.wait(timeout=400) == 0, (swarm.root / "learner.log").read_text()[-3000:]
    # Nodes keep retrying a learner that is gone until Ctrl-C, then leave cleanly.
    codes = {name: swarm.stop(name) for name in ("node0", "node1")}
    logs = {name: (swarm.root / f"{name}.log").read_text()[-2000:] for name in codes}
    assert codes == {"node0": 0, "node1": 0}, logs

    metrics = swarm.metrics()
    assert [m["version"] for m in metrics] == list(range(1, STEPS + 1))
    # Every step trains on 16 groups of 16. A node with no accepted batch yet
    # while the other is proven gets prompts beyond the pool (fairness.py);
    # when it answers, its batch is accepted and credited but may miss its step.
    trained = STEPS * 16 * 16
    assert trained <= metrics[-1]["rollouts_accepted"] <= trained * 1.25
    assert metrics[-1]["contributors"] == 2

    rewards = [m["reward_mean"] for m in metrics]
    assert mean(rewards[-10:]) > mean(rewards[:10]) + 0.1, rewards
    # Every 10th version was scored on held-out prompts while training (one
    # still being scored when the next is due is skipped).
    heldout = [json.loads(line) for line in (swarm.root / "learner" / "heldout.jsonl").read_text().splitlines()]
    assert len(heldout) >= 3 and all(h["version"] % 10 == 0 and h["prompts"] == 8 for h in heldout), heldout

    db = sqlite3.connect(swarm.root / "learner" / "ledger.sqlite")
    accepted = {bytes(h) for (h,) in db.execute("SELECT batch_hash FROM verdicts WHERE verdict='accepted'")}
    receipts = []
    for i in range(2):
        lines = (swarm.root / f"node{i}" / "receipts.jsonl").read_text().splitlines()
        receipts += [codec.decode(bytes.fromhex(json.loads(line)["receipt"]), Receipt) for line in lines]
    learner_ids = {r.learner_id for r in receipts}
    assert len(learner_ids) == 1
    for r in receipts:
        verify(r, r.learner_id)  # every receipt carries the learner's signature
    assert {r.batch_hash for r in receipts if r.verdict == "accepted"} == accepted
    assert sum(r.tokens for r in receipts) == sum(t for (t,) in db.execute("SELECT tokens FROM verdicts"))

    # The trained model does better on prompts it never saw than the one it started from.
    scores = {}
    for which in ("trained", "base"):
        base = ["--base"] if which == "base" else []
        out = swarm.run(
            "learner",
            "echo_learner",
            "eval",
            "--data-dir",
            str(swarm.root / "learner"),
            "-n",
            "8",
            "-k",
            "4",
            "--json",
            *base,
            timeout_s=120,
        )
        assert out.returncode == 0, out.stderr
        scores[which] = json.loads(out.stdout)
    assert scores["trained"]["step"] == STEPS and scores["base"]["step"] is None
    assert scores["trained"]["heldout_n"] == 8
    assert scores["trained"]["greedy_mean_reward"] > scores["base"]["greedy_mean_reward"] + 0.1, scores
