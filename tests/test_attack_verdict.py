"""bench/verdict.py, the attack bench's verdict: a rate against the
baselines beside it, carried to the same answer length and the same machine
speed (bench/observe.py's SpeedProbe), and the probe itself on this
machine's real cores."""

import os
import time

import pytest
from observe import SpeedProbe
from verdict import carried, judged, length_model


def window(rate: float, tokens_per_batch: float, slowness_ms: float | None) -> dict:
    """The keys of one scenario's result that the verdict reads."""
    return {
        "rate_per_s": rate,
        "tokens_per_batch": tokens_per_batch,
        "tokens_per_s": rate * tokens_per_batch,
        "slowness_ms": slowness_ms,
        "honest_alive": True,
        "nodes_stopped": 0,
        "ledger_consistent": True,
        "attacker": {"chunks_pulled": 3},
    }


def test_a_scenario_the_machine_ran_slower_is_judged_at_that_speed():
    # Both baselines made 10 batches/s while the probe's work took 2.0 ms;
    # the scenario made 8 while it took 2.5 ms: the machine ran at 0.8 of
    # the baselines' speed, and the swarm kept all of its pace.
    before, after = window(10.0, 100, 2.0), window(10.0, 100, 2.0)
    result = judged("empty_have_leech", window(8.0, 100, 2.5), before, after, model=(1.0, 0.0))
    assert result["honest_retained"] == pytest.approx(1.0)
    assert result["unadjusted_retained"] == pytest.approx(0.8)
    assert result["met"]
    # The same rate at the baselines' speed is an attack that cost a fifth.
    result = judged("empty_have_leech", window(8.0, 100, 2.0), before, after, model=(1.0, 0.0))
    assert result["honest_retained"] == pytest.approx(0.8)
    # Faster than the baselines' speed, the same rate is a larger loss: not a pass.
    result = judged("empty_have_leech", window(8.0, 100, 1.6), before, after, model=(1.0, 0.0))
    assert result["honest_retained"] == pytest.approx(0.64)
    assert not result["met"]


def test_each_baseline_is_carried_to_the_scenario_s_speed_on_its_own():
    # One baseline ran slow (12.5 ms), one fast (10 ms): each at the scenario's 10 ms.
    slow, fast, scenario = window(8.0, 50, 12.5), window(10.0, 50, 10.0), window(10.0, 50, 10.0)
    assert carried(slow, scenario, (1.0, 0.0)) == pytest.approx(10.0)
    assert carried(fast, scenario, (1.0, 0.0)) == pytest.approx(10.0)
    assert carried(slow, scenario, (1.0, 0.0), speed=False) == pytest.approx(8.0)
    # Without a probe reading on either side the rate is taken as it is.
    assert carried(window(8.0, 50, None), scenario, (1.0, 0.0)) == pytest.approx(8.0)


def test_the_length_model_is_fitted_at_one_machine_speed():
    # Seconds per batch = 0.1 + 0.001 x tokens at the reference speed; each
    # baseline ran at another speed (slowness), and its rate with it.
    baselines = []
    for tokens, slowness in ((50, 2.0), (100, 2.6), (150, 1.8), (200, 2.0)):
        at_reference = 1 / (0.1 + 0.001 * tokens)
        baselines.append(window(at_reference * 2.1 / slowness, tokens, slowness))  # 2.1: their mean slowness
    a, b = length_model(baselines)
    assert a == pytest.approx(0.1, rel=1e-6)
    assert b == pytest.approx(0.001, rel=1e-6)
    # Unadjusted, the speeds scatter the points and the fit misses.
    unadjusted = [dict(r, slowness_ms=None) for r in baselines]
    assert length_model(unadjusted)[0] != pytest.approx(0.1, rel=0.05)


def test_the_probe_times_its_work_on_every_core_it_is_given():
    cpus = os.sched_getaffinity(0)
    with SpeedProbe(cpus, every_s=0.05) as probe:
        deadline = time.monotonic() + 30
        while {c for _, c, _ in probe.samples} != cpus and time.monotonic() < deadline:
            time.sleep(0.05)  # the probe's thread fills its list: there is no event to await
    summary = probe.summary()
    assert set(summary["slowness_ms_by_cpu"]) == {str(c) for c in cpus}
    # ~3 ms of interpreter work here (2026-12-01: 2.1-2.7 ms); a loop the
    # interpreter skipped, or one that ran wild, is outside.
    assert all(0.05 < ms < 200 for ms in summary["slowness_ms_by_cpu"].values())
    assert summary["slowness_ms"] == pytest.approx(
        1000 * sum(s for *_, s in probe.samples) / len(probe.samples), abs=1e-3
    )
    # The thread is gone and this thread's cores are as they were.
    assert not probe.thread.is_alive()
    assert os.sched_getaffinity(0) == cpus
