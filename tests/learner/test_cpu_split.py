"""CpuSplit: the learner's CPU per accepted batch, by phase, each in its thread's CPU time."""

import threading
import time

import pytest

from echo_learner.verify.cpu_split import PHASES, CpuSplit


def spin(seconds: float) -> None:
    """Burn about ``seconds`` of this thread's CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_phase_counts_its_own_cpu_not_its_waits():
    split = CpuSplit()
    with split.phase("train"):
        spin(0.05)
    with split.phase("ledger"):
        time.sleep(0.05)  # waiting costs no CPU
    assert 0.05 <= split.seconds["train"] < 0.2
    assert split.seconds["ledger"] < 0.01


def test_work_in_another_thread_is_metered_in_that_thread():
    split = CpuSplit()
    worker = threading.Thread(target=split.timed, args=("publish", spin, 0.05))
    worker.start()
    time.sleep(0.01)
    spin(0.05)  # the caller's own CPU meanwhile is not the phase's
    worker.join()
    split.add("recompute", 0.25)  # measured by a pass in a worker thread
    assert 0.05 <= split.seconds["publish"] < 0.09
    assert split.seconds["recompute"] == 0.25


def test_the_split_is_per_accepted_batch_and_other_is_the_rest_of_the_process():
    split = CpuSplit()
    with split.phase("signature"):
        spin(0.04)
    spin(0.04)  # in no phase: other
    split.accepted = 4
    report = split.to_json()
    per_batch = report["cpu_ms_per_batch"]
    assert list(per_batch) == [*PHASES, "other"]
    assert report["accepted_batches"] == 4
    assert per_batch["signature"] == pytest.approx(split.seconds["signature"] * 1000 / 4, abs=1e-3)
    assert per_batch["other"] >= 0.04 * 1000 / 4 * 0.9
    assert report["cpu_s"] >= 0.08 * 0.9
    assert sum(per_batch.values()) == pytest.approx(report["cpu_s"] * 1000 / 4, rel=0.05)
