"""``echo-learner run --train-procs 2``: a real swarm trains on two FSDP ranks, and resumes."""

import subprocess

import psutil
import pytest
import torch

from echo_learner.training.model import build_model

STEPS = 6


def rank_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if "echo_learner.training.train_worker" in (p.info["cmdline"] or []):
            found.append(p)
    return found


def finished(swarm, learner, timeout_s: float = 300) -> int:
    """The learner's exit code; on a timeout, what every process was doing."""
    try:
        return learner.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the learner did not finish in {timeout_s} s:\n" + swarm.log_tails(4000)) from None


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_learner_on_two_ranks_trains_publishes_and_resumes(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    run = ("--train-procs", "2", "--mode", "async", "--checkpoint-every", "3", "--eval-every", "0")
    learner = swarm.start_learner(*run, "--steps", str(STEPS))
    swarm.start_node(0, "-v")  # its log tells what it waited on, should a wait time out
    assert finished(swarm, learner) == 0, (swarm.root / "learner.log").read_text()[-3000:]
    metrics = swarm.metrics()
    assert [m["step"] for m in metrics] == list(range(STEPS))
    assert any(m["tokens"] > 0 for m in metrics)  # steps that trained, not only skipped ones
    assert metrics[-1]["version"] >= 1  # the ranks' weights were published
    first = torch.load(swarm.root / "learner" / "checkpoint.pt", weights_only=True)
    assert first["step"] == STEPS
    initial = build_model().state_dict()
    assert any(not torch.equal(v, initial[k]) for k, v in first["model"].items())
    # The optimiser state in one process's own form: every parameter, numbered.
    assert set(first["optimizer"]["state"]) == set(range(len(list(build_model().parameters()))))
    assert rank_processes() == []  # the learner's exit ended its ranks

    # Resume on two ranks: the checkpoint's weights and optimiser go to them.
    learner = swarm.start_learner(*run, "--steps", str(STEPS + 3), "--resume")
    assert finished(swarm, learner) == 0, (swarm.root / "learner.log").read_text()[-3000:]
    after = swarm.metrics()[STEPS:]
    assert [m["step"] for m in after] == [STEPS, STEPS + 1, STEPS + 2]
    assert after[0]["version"] > metrics[-1]["version"]
    second = torch.load(swarm.root / "learner" / "checkpoint.pt", weights_only=True)
    assert second["step"] == STEPS + 3
    steps_counted = {int(s["step"]) for s in second["optimizer"]["state"].values()}
    assert max(steps_counted) > max(int(s["step"]) for s in first["optimizer"]["state"].values())
    assert rank_processes() == []
