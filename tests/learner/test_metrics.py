"""/metrics as Prometheus reads it: prometheus-client's own parser on what the learner renders."""

import time

from prometheus_client.parser import text_string_to_metric_families

from echo_learner.metrics import LearnerMetrics
from echo_learner.swarm.capacity import CapacityMeter


def status(**over) -> dict:
    base = {
        "rollouts_accepted": 96,
        "batches_accepted": 6,
        "refusals": {"bad_signature": 2, "replayed_nonce": 1},
        "step": 12,
        "heldout": {"accuracy": 0.5, "version": 10},
        "version": 11,
        "steps_per_s": 1.5,
        "utilization": 0.8,
        "capacity": {"utilization": 0.85, "forecast_error": None},
        "peers": 3,
        "broadcast": {"bytes_published": 123456},
        "bootstrap": [{"addr": '/ip4/127.0.0.1/tcp/1/p2p/Qm"x', "answers": True}],
    }
    return {**base, **over}


def scrape(metrics: LearnerMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def test_status_values_and_timings_as_prometheus_reads_them():
    current = status()
    metrics = LearnerMetrics(lambda: current)
    meter = CapacityMeter(60.0, metrics.timings)
    meter.on_train(0.0, 0.3)
    meter.on_train(1.0, 1.02)
    meter.on_verify(0.004, rollouts=16)
    meter.on_publish(11, time.monotonic() - 2.0, time.monotonic() - 1.5)
    meter.on_node_holds("peer-a", 11)
    meter.on_node_holds("peer-a", 11)  # once per node and version

    families = scrape(metrics)
    assert families["echo_rollouts_accepted"].type == "counter"
    assert families["echo_rollouts_accepted"].samples[0].value == 96
    refused = {s.labels["reason"]: s.value for s in families["echo_batches_refused"].samples}
    assert refused == {"bad_signature": 2, "replayed_nonce": 1}
    (up,) = families["echo_bootstrap_up"].samples
    assert up.labels["addr"] == '/ip4/127.0.0.1/tcp/1/p2p/Qm"x' and up.value == 1  # escaped and read back
    assert families["echo_forecast_error"].samples == []  # not measured yet: no sample, not a 0

    step = {s.name: s for s in families["echo_train_step_seconds"].samples if not s.labels}
    assert families["echo_train_step_seconds"].type == "histogram"
    assert step["echo_train_step_seconds_count"].value == 2
    assert abs(step["echo_train_step_seconds_sum"].value - 0.32) < 1e-9
    buckets = {s.labels["le"]: s.value for s in families["echo_train_step_seconds"].samples if "le" in s.labels}
    assert buckets["0.025"] == 1 and buckets["0.25"] == 1 and buckets["0.5"] == 2 and buckets["+Inf"] == 2
    assert [s.value for s in families["echo_verify_batch_seconds"].samples if s.name.endswith("_count")] == [1]
    broadcast = [s.value for s in families["echo_broadcast_seconds"].samples if s.name.endswith("_sum")]
    assert len(broadcast) == 1 and 1.4 < broadcast[0] < 3.0

    # Read at scrape time: the next scrape sees the learner's new state.
    current["rollouts_accepted"] = 112
    assert scrape(metrics)["echo_rollouts_accepted"].samples[0].value == 112
