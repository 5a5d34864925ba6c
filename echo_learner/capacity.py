"""ECHO-2's capacity model, live: is the swarm producing rollouts fast enough
to keep the learner busy at the current staleness bound?

Measured here: the learner's train-step and publish times, how long a new
version takes to reach the nodes (publish -> a node asks for work holding it),
and the learner's busy fraction. Each node's rollout throughput comes from
``PeerBook``. ``forecast`` turns them into a predicted utilization:

- sync: a step waits for the version to spread and for a whole batch to be
  generated with it, so ``period = train + publish + broadcast + B / R``.
- async, staleness S, publish every K steps: generation overlaps training,
  so the learner's own compute per step is training plus verifying the next
  B rollouts (the log-prob recompute; in sync mode it hides in the wait for
  rollouts) plus a K-th of a publish. The learner is starved if rollouts
  arrive slower than it consumes them (``B / R``) or if a rollout's trip
  (broadcast + work cycle) spans more than the S versions the window allows,
  which happens in ``K * S`` steps:
  ``period = max(train + verify + publish / K, B / R, (broadcast + cycle) / (K * S))``.

Utilization is ``train / period``; the rollout rate needed to keep the
learner busy is ``B / (train + verify + publish / K)``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass

EWMA = 0.2


def running_mean(old: float, new: float, weight: float = EWMA) -> float:
    """Exponentially weighted mean; the first sample (old == 0) is taken as is."""
    return new if old == 0 else (1 - weight) * old + weight * new


@dataclass(frozen=True)
class Forecast:
    utilization: float
    needed_rollouts_per_s: float
    supply_rollouts_per_s: float
    verdict: str

    def to_json(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def forecast(
    *,
    staleness: int,
    publish_every: int,
    rollouts_per_step: int,
    train_s: float,
    verify_s: float,
    publish_s: float,
    broadcast_s: float,
    cycle_s: float,
    supply_rps: float,
) -> Forecast:
    busy = train_s + publish_s / publish_every + (verify_s if staleness > 0 else 0.0)
    needed = rollouts_per_step / busy if busy > 0 else 0.0
    generate_s = rollouts_per_step / supply_rps if supply_rps > 0 else float("inf")
    if staleness == 0:
        period = train_s + publish_s + broadcast_s + generate_s
    else:
        period = max(busy, generate_s, (broadcast_s + cycle_s) / (publish_every * staleness))
    utilization = min(1.0, train_s / period) if period > 0 else 0.0
    trip_bound = staleness > 0 and period > max(busy, generate_s)
    if trip_bound:
        k = math.ceil((broadcast_s + cycle_s) / (staleness * busy))
        verdict = (
            f"versions spread slower than the staleness window allows: "
            f"publish every {k} steps (--publish-every) or raise --staleness"
        )
    elif supply_rps <= 0:
        verdict = "no rollout throughput measured yet"
    elif supply_rps >= needed:
        verdict = f"enough rollout throughput ({supply_rps / needed:.1f}x what keeps the learner busy)"
    else:
        verdict = f"needs {needed / supply_rps:.1f}x more rollout throughput to keep the learner busy"
    return Forecast(utilization, needed, supply_rps, verdict)


class CapacityMeter:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self.started = time.monotonic()
        self.train_s = 0.0
        self.publish_s = 0.0
        self.broadcast_s = 0.0
        self.verify_s_per_rollout = 0.0
        self._busy: deque[tuple[float, float]] = deque()  # (start, end) of train steps
        self._published: dict[int, float] = {}  # version -> monotonic time
        # (peer, version) -> seconds from publishing the version until the peer held it
        self._arrived: dict[tuple[str, int], float] = {}

    def on_train(self, start: float, end: float) -> None:
        self.train_s = running_mean(self.train_s, end - start)
        self._busy.append((start, end))
        while self._busy and self._busy[0][1] < end - self.window_s:
            self._busy.popleft()

    def on_verify(self, seconds: float, rollouts: int) -> None:
        """The log-prob recompute of one batch took ``seconds``."""
        self.verify_s_per_rollout = running_mean(self.verify_s_per_rollout, seconds / max(rollouts, 1))

    def on_publish(self, version: int, start: float, end: float) -> None:
        self.publish_s = running_mean(self.publish_s, end - start)
        self._published[version] = end
        for old in sorted(self._published)[:-8]:
            del self._published[old]
        self._arrived = {k: s for k, s in self._arrived.items() if k[1] in self._published}

    def on_node_holds(self, peer: str, version: int) -> None:
        """A node's Have shows all of ``version``: the version reached it."""
        published = self._published.get(version)
        if published is None or (peer, version) in self._arrived:
            return
        elapsed = time.monotonic() - published
        self._arrived[(peer, version)] = elapsed
        self.broadcast_s = running_mean(self.broadcast_s, elapsed)

    def holders(self, version: int) -> set[str]:
        """Peers whose Have showed all of ``version``."""
        return {p for p, v in self._arrived if v == version}

    def spread_s(self, version: int) -> float | None:
        """Seconds from publishing ``version`` until the latest node that holds it
        got it (None before any node has it)."""
        return max((s for (_, v), s in self._arrived.items() if v == version), default=None)

    def utilization(self) -> float:
        """Fraction of the last ``window_s`` seconds spent in training steps."""
        now = time.monotonic()
        start = max(self.started, now - self.window_s)
        busy = sum(max(0.0, min(e, now) - max(s, start)) for s, e in self._busy)
        return busy / (now - start) if now > start else 0.0
