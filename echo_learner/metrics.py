"""The learner's Prometheus metrics (``GET /metrics``), with prometheus-client.

Two kinds: histograms of what the learner times as it happens (a training
step, the log-prob recompute of a batch, a version's way to a node), and
values read at scrape time from what the status API shows, so that the page,
``echo-learner status`` and a scrape agree. Each learner has a registry of
its own (tests run several in one process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# generate_latest writes the 0.0.4 text format, which every Prometheus reads.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# A step of the built-in model takes ~0.05-0.5 s on a CPU, SmolLM2's seconds to a minute.
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A batch's recompute: milliseconds (tiny model) to tens of seconds (long answers).
VERIFY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A version's broadcast: ~1 s for the tiny model at 20 Mbit/s, minutes for a large one on home links.
BROADCAST_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class Timings:
    """Histograms observed as things happen (``CapacityMeter`` feeds them)."""

    def __init__(self, registry: CollectorRegistry):
        self.train_step = Histogram(
            "echo_train_step_seconds", "Time of one training step.", buckets=STEP_BUCKETS, registry=registry
        )
        self.verify = Histogram(
            "echo_verify_batch_seconds",
            "Time of one log-prob recompute pass (one rollout batch, or several of one version: --verify-batch).",
            buckets=VERIFY_BUCKETS,
            registry=registry,
        )
        self.broadcast = Histogram(
            "echo_broadcast_seconds",
            "Time from publishing a version to a node holding all of it.",
            buckets=BROADCAST_BUCKETS,
            registry=registry,
        )


class StatusCollector(Collector):
    """Counters and gauges read from ``status()`` (``Learner.status``) at each scrape."""

    def __init__(self, status: Callable[[], dict]):
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status()

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value)

        def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc)
            if value is not None:
                family.add_metric([], value)
            return family

        yield counter("echo_rollouts_accepted", "Rollouts that passed verification.", s["rollouts_accepted"])
        yield counter("echo_batches_accepted", "Rollout batches that passed verification.", s["batches_accepted"])
        refused = CounterMetricFamily("echo_batches_refused", "Rollout batches refused, by reason.", labels=["reason"])
        for reason, n in sorted(s["refusals"].items()):
            refused.add_metric([reason], n)
        yield refused
        yield gauge("echo_training_step", "Training steps done.", s["step"])
        heldout = s["heldout"] or {}
        yield gauge(
            "echo_heldout_accuracy",
            "Greedy accuracy on held-out prompts of the newest scored version.",
            heldout.get("accuracy"),
        )
        yield gauge("echo_heldout_version", "The policy version the held-out accuracy is of.", heldout.get("version"))
        yield gauge("echo_policy_version", "Newest published policy version.", s["version"])
        yield gauge("echo_steps_per_second", "Training steps per second (recent).", s["steps_per_s"])
        yield gauge("echo_learner_utilization", "Share of recent time spent training.", s["utilization"])
        capacity = s["capacity"]
        yield gauge(
            "echo_learner_utilization_forecast",
            "The capacity model's utilization forecast for the next window.",
            capacity["utilization"],
        )
        yield gauge(
            "echo_forecast_error",
            "Mean absolute error of recent utilization forecasts, checked against what happened.",
            capacity["forecast_error"],
        )
        yield gauge("echo_peers", "Nodes seen recently.", s["peers"])
        yield counter(
            "echo_broadcast_bytes",
            "Bytes of weights published (one copy per version).",
            s["broadcast"]["bytes_published"],
        )
        up = GaugeMetricFamily(
            "echo_bootstrap_up", "1 if the bootstrap peer answered its last ping, else 0.", labels=["addr"]
        )
        for b in s["bootstrap"]:
            up.add_metric([b["addr"]], 1 if b["answers"] else 0)
        yield up


class LearnerMetrics:
    """One learner's registry: its ``timings`` and its status, rendered for a scrape."""

    def __init__(self, status: Callable[[], dict]):
        self.registry = CollectorRegistry(auto_describe=False)
        self.timings = Timings(self.registry)
        self.registry.register(StatusCollector(status))

    def render(self) -> bytes:
        return generate_latest(self.registry)
