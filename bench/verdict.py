"""How bench/attacks.py judges a scenario: its honest batch rate against the
baselines run beside it, carried to the same answer length and the same
machine speed.

A scenario's result carries ``rate_per_s`` (honest accepted batches a
second), ``tokens_per_batch``, ``tokens_per_s`` and ``slowness_ms`` (the
machine's speed over its window, ``observe.SpeedProbe``); ``judged`` adds
the verdict's figures to it.
"""

from __future__ import annotations

import statistics

from attack_catalog import CONTROL, TARGET, engaged


def speed_of(result: dict, reference_ms: float | None) -> float:
    """How much faster than ``reference_ms`` this machine ran during
    ``result``'s window (``SpeedProbe``: its slowness over the reference's);
    1 when either is unknown."""
    slowness = result.get("slowness_ms")
    return reference_ms / slowness if slowness and reference_ms else 1.0


def length_model(baselines: list[dict]) -> tuple[float, float]:
    """``(a, b)``: a baseline swarm's seconds per accepted batch as
    ``a + b * tokens_per_batch`` at the baselines' mean machine speed
    (``speed_of``), fitted to this mode's baselines (least squares, both
    kept >= 0).

    Why: as the policy learns, its answers shorten, and a batch's cost with
    them, but not in proportion: part of it is per batch (a step, a version,
    a receipt), part per token (generating, recomputing, training). Judged in
    batches, a scenario whose policy answered short read high; in tokens, it
    read low (2026-11-29, 14:41 UTC, sync: relay_exhaustion answered 100.5
    tokens a batch against the baselines' 117.8-143.9, and read 0.975 in
    batches, 0.765 in tokens, 0.814 against this fit, s = 0.0457 + 0.00117 *
    tokens). With b = 0 the fit is batches/s, with a = 0 tokens/s. Points
    at their machine's speed: this machine's speed drifts by +-15 % over
    minutes, and with it a swarm's pace, whatever the answers' length.
    """
    reference = mean_slowness(baselines)
    points = [(b["tokens_per_batch"], speed_of(b, reference) / b["rate_per_s"]) for b in baselines if b["rate_per_s"]]
    if len(points) < 3 or len({t for t, _ in points}) < 2:
        return 0.0, 1.0  # too few to fit: tokens/s
    slope, intercept = statistics.linear_regression(*zip(*points))
    if slope <= 0:
        return 1.0, 0.0
    if intercept <= 0:
        return 0.0, 1.0
    return intercept, slope


def mean_slowness(results: list[dict]) -> float | None:
    known = [r["slowness_ms"] for r in results if r.get("slowness_ms")]
    return statistics.mean(known) if known else None


def carried(baseline: dict, to: dict, model: tuple[float, float], speed: bool = True) -> float:
    """``baseline``'s batch rate carried to ``to``'s answer length (``model``,
    ``length_model``) and, with ``speed``, to the machine's speed during
    ``to``'s window (``SpeedProbe``)."""
    a, b = model
    length = baseline["tokens_per_batch"] or 0.0
    rate = baseline["rate_per_s"] * (a + b * length) / (a + b * to["tokens_per_batch"])
    return rate * speed_of(to, baseline.get("slowness_ms")) if speed else rate


def judged(name: str, result: dict, before: dict, after: dict, model: tuple[float, float]) -> dict:
    """``result`` against the baselines run just before and just after it,
    each baseline's batch rate carried to the scenario's answer length and
    machine speed (``carried``)."""
    for speed, key in ((True, "honest_retained"), (False, "unadjusted_retained")):
        reference = (carried(before, result, model, speed) + carried(after, result, model, speed)) / 2
        reference = reference if result["tokens_per_batch"] else 0.0
        if speed:
            result["baseline_rate_per_s"] = round(reference, 3)
        # unadjusted_retained: at the same answer length, not the same machine speed.
        result[key] = round(result["rate_per_s"] / reference, 3) if reference else 0.0
    # The same in plain batches and in tokens, reported beside it.
    for key, kept in (("rate_per_s", "batches_retained"), ("tokens_per_s", "tokens_retained")):
        beside = (before[key] + after[key]) / 2
        result[kept] = round(result[key] / beside, 3) if beside else 0.0
    # The learner's CPU per honest batch (and token) during the scenario over
    # the same in the baselines beside it: above 1, the attack costs the learner.
    for key, ratio in (
        ("learner_cpu_ms_per_batch", "learner_cpu_per_batch_ratio"),
        ("learner_cpu_us_per_token", "learner_cpu_per_token_ratio"),
        ("learner_control_ms_per_batch", "learner_control_ratio"),
    ):
        beside = [b[key] for b in (before, after) if b.get(key)]
        if result.get(key) and beside:
            result[ratio] = round(result[key] / statistics.mean(beside), 3)
    # An attack that did not take hold is not a pass, nor a control whose
    # members never joined a measure of their presence.
    result["engaged"] = engaged(name, result.get("attacker", {}))
    if name == CONTROL:
        return result
    result["target"] = TARGET.get(name, 0.8)
    result["met"] = (
        result["honest_retained"] >= result["target"]
        and result["honest_alive"]
        and result["nodes_stopped"] == 0
        and result["ledger_consistent"]
        and result["engaged"]
        and result.get("honest_reserved", True)
    )
    return result


def coefficient_of_variation(rates: list[float]) -> float | None:
    return round(statistics.stdev(rates) / statistics.mean(rates), 3) if len(rates) > 1 and any(rates) else None
