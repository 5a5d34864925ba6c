"""The capacity model's forecast in each regime."""

import time

import pytest

from echo_learner.swarm.capacity import CapacityMeter, ForecastInputs, forecast

BASE = dict(rollouts_per_step=256, train_s=0.2, verify_s=0.0, publish_s=0.04, broadcast_s=1.0, cycle_s=0.3)


def test_sync_pays_for_broadcast_and_generation_every_step():
    f = forecast(ForecastInputs(staleness=0, publish_every=1, supply_rps=512, **BASE))
    assert f.utilization == pytest.approx(0.2 / (0.2 + 0.04 + 1.0 + 0.5))


def test_async_with_ample_supply_and_a_wide_window_keeps_the_learner_busy():
    f = forecast(ForecastInputs(staleness=2, publish_every=4, supply_rps=5000, **BASE))
    assert f.utilization == pytest.approx(0.2 / 0.21)
    assert f.verdict.startswith("enough rollout throughput")


def test_async_starved_of_rollouts_says_how_much_more_it_needs():
    f = forecast(ForecastInputs(staleness=2, publish_every=4, supply_rps=400, **BASE))
    assert f.utilization == pytest.approx(0.2 / (256 / 400))
    assert f.needed_rollouts_per_s == pytest.approx(256 / 0.21)
    assert "needs 3.0x more" in f.verdict


def test_async_whose_window_is_shorter_than_a_broadcast_recommends_publishing_less_often():
    f = forecast(ForecastInputs(staleness=2, publish_every=1, supply_rps=5000, **BASE))
    assert f.utilization == pytest.approx(0.2 / (1.3 / 2))
    assert "publish every 3 steps" in f.verdict


def test_async_verification_runs_beside_training_and_must_keep_pace():
    f = forecast(ForecastInputs(staleness=2, publish_every=4, supply_rps=5000, **{**BASE, "verify_s": 0.05}))
    assert f.utilization == pytest.approx(0.2 / 0.21)  # overlapped with the step
    slow = forecast(ForecastInputs(staleness=2, publish_every=4, supply_rps=5000, **{**BASE, "verify_s": 0.4}))
    # It cannot keep up: both threads run side by side for the whole period,
    # each measured time holding the other's share.
    assert slow.utilization == pytest.approx(0.2 / ((0.21 + 0.4) / 2))
    assert "verifying a batch takes 0.40 s" in slow.verdict
    sync = forecast(ForecastInputs(staleness=0, publish_every=1, supply_rps=512, **{**BASE, "verify_s": 0.05}))
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


def test_forecasts_are_checked_against_the_window_that_followed():
    meter = CapacityMeter(window_s=60)
    t0 = meter.started
    meter.on_forecast(0.5, now=t0)  # the learner will be busy half of the next minute...
    meter.on_forecast(0.9, now=t0 + 1)  # (too soon after the last: not kept)
    for k in range(6):  # ...and it trains 6 s of every 10 s
        meter.on_train(t0 + 10 * k, t0 + 10 * k + 6)
    assert meter.forecast_error() is None  # its minute has not passed
    meter.on_forecast(0.6, now=t0 + 60)
    assert meter.last_settled == (0.5, pytest.approx(0.6))
    assert meter.forecast_error() == pytest.approx(0.1)
    meter.settle(now=t0 + 120)  # the second forecast: nothing trained in its minute
    assert meter.last_settled == (0.6, pytest.approx(0.0))
    assert meter.forecast_error() == pytest.approx((0.1 + 0.6) / 2)


def test_async_publishing_waits_for_the_last_version_to_spread():
    from echo_learner.swarm.capacity import publish_due

    assert not publish_due(publish_every=3, steps_since=2, since_publish_s=9.0, broadcast_s=1.2)
    assert not publish_due(publish_every=3, steps_since=3, since_publish_s=0.9, broadcast_s=1.2)
    assert publish_due(publish_every=3, steps_since=4, since_publish_s=1.2, broadcast_s=1.2)
    assert publish_due(publish_every=3, steps_since=3, since_publish_s=0.9, broadcast_s=0.0)  # not measured


def test_time_a_version_has_left_in_the_window():
    from echo_learner.swarm.capacity import window_left_s

    def left(version: int, steps_since: int, since_publish_s: float = 9.0, broadcast_s: float = 0.0) -> float:
        return window_left_s(
            version=version,
            current=10,
            staleness=2,
            publish_every=3,
            steps_since=steps_since,
            step_period_s=0.5,
            since_publish_s=since_publish_s,
            broadcast_s=broadcast_s,
        )

    # The step under way may end now: after it, one more step, then the publish
    # that moves the window; the newest has two more versions of 3 steps after that.
    assert left(8, 1) == pytest.approx(1 * 0.5)
    assert left(10, 1) == pytest.approx((1 + 2 * 3) * 0.5)
    # A publish is due when the step under way ends: no time at all.
    assert left(8, 2) == 0.0
    assert left(8, 5) == 0.0
    # ...unless pacing holds it back until the last version has spread (1.2 s),
    # and each later one too.
    assert left(8, 5, since_publish_s=0.2, broadcast_s=1.2) == pytest.approx(1.0)
    assert left(9, 5, since_publish_s=0.2, broadcast_s=2.0) == pytest.approx(1.8 + 2.0)
    assert left(7, 0) == 0.0  # already out


def test_the_learner_s_own_time_per_step_counts_what_it_does_between_steps_but_not_its_waits():
    meter = CapacityMeter(window_s=60)
    start = 100.0
    for _ in range(200):
        # 0.2 s training, 0.05 s of other work, then 0.1 s waiting for the next batch.
        meter.on_train(start, start + 0.2, waited=0.1)
        start += 0.2 + 0.05 + 0.1
    meter.on_bookkeeping(0.01)  # what it timed after training: less than it spends
    assert meter.train_s == pytest.approx(0.2)
    assert meter.overhead_s == pytest.approx(0.05)


def test_the_forecast_starts_from_the_measured_utilization_and_moves_as_far_as_the_model_does():
    meter = CapacityMeter(window_s=60)
    start = 100.0

    def steps(seconds: float, model: float) -> None:
        # Steps of 0.16 s every 0.2 s (80 % busy), while the model says ``model``.
        nonlocal start
        for _ in range(round(seconds / 0.2)):
            meter.on_train(start, start + 0.16)
            meter.on_model(model, now=start + 0.16)
            start += 0.2

    assert meter.anchored(now=start) is None  # nothing measured yet: the model alone
    steps(10, model=0.95)
    assert meter.anchored(now=start) is None  # its first seconds say little about the next minute
    steps(20, model=0.95)
    # The model misses how the stages queue (0.95); what happened is 0.8.
    assert meter.anchored(now=start) == pytest.approx(0.8, abs=0.01)
    # Supply halves: the model says so at once, the measurement only later.
    steps(5, model=0.475)
    recent = (15 * 0.95 + 5 * 0.475) / 20
    assert meter.anchored(now=start) == pytest.approx(0.8 * 0.475 / recent, abs=0.02)


def test_a_learner_whose_cores_are_saturated_steps_no_faster_than_they_allow():
    # 0.4 CPU-s a step (training, verification, the event loop) on one core.
    one = forecast(ForecastInputs(staleness=2, publish_every=4, supply_rps=5000, cpu_s=0.4, cores=1, **BASE))
    assert one.utilization == pytest.approx(0.2 / 0.4)
    assert "core(s) are saturated" in one.verdict
    # On two cores the same work fits beside the step.
    two = forecast(ForecastInputs(staleness=2, publish_every=4, supply_rps=5000, cpu_s=0.4, cores=2, **BASE))
    assert two.utilization > 0.9 and "saturated" not in two.verdict


def test_the_inputs_show_in_metrics_and_status_in_the_order_they_always_had():
    """metrics.jsonl and /api/status print ``to_json()``: its keys in this
    order (readers of old files rely on it), each with the value fed in."""
    inputs = ForecastInputs(staleness=2, publish_every=4, supply_rps=5000, cpu_s=0.7, cores=2, **BASE)
    assert list(inputs.to_json().items()) == [
        ("staleness", 2),
        ("publish_every", 4),
        ("rollouts_per_step", 256),
        ("train_s", 0.2),
        ("bookkeeping_s", 0.0),
        ("verify_s", 0.0),
        ("publish_s", 0.04),
        ("broadcast_s", 1.0),
        ("cycle_s", 0.3),
        ("supply_rps", 5000),
        ("cpu_s", 0.7),
        ("cores", 2),
    ]
