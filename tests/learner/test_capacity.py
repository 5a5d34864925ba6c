"""The capacity model's forecast in each regime."""

import time

import pytest

from echo_learner.capacity import CapacityMeter, forecast

BASE = dict(rollouts_per_step=256, train_s=0.2, verify_s=0.0, publish_s=0.04, broadcast_s=1.0, cycle_s=0.3)


def test_sync_pays_for_broadcast_and_generation_every_step():
    f = forecast(staleness=0, publish_every=1, supply_rps=512, **BASE)
    assert f.utilization == pytest.approx(0.2 / (0.2 + 0.04 + 1.0 + 0.5))


def test_async_with_ample_supply_and_a_wide_window_keeps_the_learner_busy():
    f = forecast(staleness=2, publish_every=4, supply_rps=5000, **BASE)
    assert f.utilization == pytest.approx(0.2 / 0.21)
    assert f.verdict.startswith("enough rollout throughput")


def test_async_starved_of_rollouts_says_how_much_more_it_needs():
    f = forecast(staleness=2, publish_every=4, supply_rps=400, **BASE)
    assert f.utilization == pytest.approx(0.2 / (256 / 400))
    assert f.needed_rollouts_per_s == pytest.approx(256 / 0.21)
    assert "needs 3.0x more" in f.verdict


def test_async_whose_window_is_shorter_than_a_broadcast_recommends_publishing_less_often():
    f = forecast(staleness=2, publish_every=1, supply_rps=5000, **BASE)
    assert f.utilization == pytest.approx(0.2 / (1.3 / 2))
    assert "publish every 3 steps" in f.verdict


def test_async_learner_also_spends_its_time_verifying():
    f = forecast(staleness=2, publish_every=4, supply_rps=5000, **{**BASE, "verify_s": 0.05})
    assert f.utilization == pytest.approx(0.2 / 0.26)
    sync = forecast(staleness=0, publish_every=1, supply_rps=512, **{**BASE, "verify_s": 0.05})
    assert sync.utilization == pytest.approx(0.2 / (0.2 + 0.04 + 1.0 + 0.5))  # hidden in the wait


def test_the_meter_knows_how_long_the_newest_version_took_to_spread():
    meter = CapacityMeter(window_s=60)
    now = time.monotonic()
    meter.on_publish(7, now - 3.0, now - 2.0)  # published 2 s ago
    assert meter.spread_s(7) is None  # nobody holds it yet
    meter.on_node_holds("a", 7)
    meter.on_node_holds("b", 7)
    first = meter.spread_s(7)
    assert first is not None and 2.0 <= first < 10.0
    meter.on_node_holds("a", 7)  # a repeat report changes nothing
    assert meter.spread_s(7) >= first
    assert meter.spread_s(8) is None
