"""The learner's state as Prometheus metrics (text exposition format 0.0.4), for ``GET /metrics``.

Counters end in ``_total``; every value comes from what the status API shows,
so the page, ``echo-learner status`` and a Prometheus scrape agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from echo_learner.service import Learner

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(learner: Learner) -> str:
    status = learner.status()
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

    metric("echo_rollouts_accepted_total", "counter", "Rollouts that passed verification.",
           [("", status["rollouts_accepted"])])
    metric("echo_batches_accepted_total", "counter", "Rollout batches that passed verification.",
           [("", status["batches_accepted"])])
    metric("echo_batches_refused_total", "counter", "Rollout batches refused, by reason.",
           [(f'{{reason="{_label(reason)}"}}', n) for reason, n in sorted(status["refusals"].items())])
    metric("echo_training_step", "gauge", "Training steps done.", [("", status["step"])])
    heldout = status["heldout"]
    metric("echo_heldout_accuracy", "gauge", "Greedy accuracy on held-out prompts of the newest scored version.",
           [("", heldout["accuracy"])] if heldout else [])
    metric("echo_heldout_version", "gauge", "The policy version the held-out accuracy is of.",
           [("", heldout["version"])] if heldout else [])
    metric("echo_policy_version", "gauge", "Newest published policy version.", [("", status["version"])])
    metric("echo_train_step_seconds", "gauge", "Mean time of one training step.",
           [("", status["measurements"]["train_s"])])
    metric("echo_steps_per_second", "gauge", "Training steps per second (recent).", [("", status["steps_per_s"])])
    metric("echo_learner_utilization", "gauge", "Share of recent time spent training.",
           [("", status["utilization"])])
    capacity = status["capacity"]
    metric("echo_learner_utilization_forecast", "gauge", "The capacity model's utilization forecast for the next window.",
           [("", capacity["utilization"])])
    metric("echo_forecast_error", "gauge", "Mean absolute error of recent utilization forecasts, checked against what happened.",
           [("", capacity["forecast_error"])] if capacity["forecast_error"] is not None else [])
    metric("echo_peers", "gauge", "Nodes seen recently.", [("", status["peers"])])
    metric("echo_broadcast_bytes_total", "counter", "Bytes of weights published (one copy per version).",
           [("", status["broadcast"]["bytes_published"])])
    metric("echo_broadcast_seconds", "gauge", "Mean time from publishing a version to a node holding it.",
           [("", status["measurements"]["broadcast_s"])])
    metric("echo_bootstrap_up", "gauge", "1 if the bootstrap peer answered its last ping, else 0.",
           [(f'{{addr="{_label(b["addr"])}"}}', 1 if b["answers"] else 0) for b in status["bootstrap"]])
    return "\n".join(lines) + "\n"
