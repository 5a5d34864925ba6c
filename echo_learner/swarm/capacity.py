"""ECHO-2's capacity model, live: is the swarm producing rollouts fast enough
to keep the learner busy at the current staleness bound?

Measured here: the learner's train-step and publish times, how long a new
version takes to reach the nodes (publish -> a node asks for work holding it),
and the learner's busy fraction. Each node's rollout throughput comes from
``PeerBook``. ``forecast`` turns them (``ForecastInputs``) into a predicted
utilization:

- sync: a step waits for the version to spread and for a whole batch to be
  generated with it, so ``period = train + publish + broadcast + B / R``.
- async, staleness S, K steps per version (at least ``--publish-every``:
  publishing is paced, ``publish_due``): generation overlaps training, so the
  learner's own work per step is training plus a K-th of a publish (and
  checkpoints, step records, and the event loop's own work between steps on
  the same cores: measured together, per step, as ``bookkeeping``, the step
  period less training and the waits for a batch; timing only publishing and
  checkpoints forecast too high). The
  log-prob recompute that verifies the next B rollouts runs beside the
  training step (another thread; where they share a core, the measured
  train time already holds the contention), and must keep pace. The learner
  is starved if rollouts arrive slower than it consumes them (``B / R``) or
  if a rollout's trip (broadcast + work cycle) spans more than the S
  versions the window allows, which happens in ``K * S`` steps:
  ``period = max(train + bookkeeping, verify', B / R, (broadcast + cycle) / (K * S), cpu / cores)``,
  the last the learner process's CPU time per step (all threads) on the
  cores it may use: it cannot step faster than they allow.
  Training and verification share the learner's cores, each measured while
  the other runs: while verify <= train + bookkeeping, verification hides in
  the step (``verify' = verify``; adding it to the train time forecast far
  too low); once it takes longer, both threads run side by side for the
  whole period and each measured time holds the other's share, so the period
  is about their mean, ``verify' = (train + bookkeeping + verify) / 2`` (it
  fits the logged inputs of async bench runs better than ``verify' = verify``).

Utilization is ``train / period``; the rollout rate needed to keep the
learner busy is ``B / (train + bookkeeping)``.

The forecast for the next window is the model's anchored to what this run
measured (``CapacityMeter.anchored``): the utilization of the last seconds,
moved as far as the model has moved since.

The forecast is checked against what happens: ``CapacityMeter.on_forecast``
keeps each forecast of the next ``window_s`` seconds until they have passed,
then compares it with the utilization measured over them; ``forecast_error``
is the mean absolute difference of the recent ones.

What each of these choices was measured against, with the figures:
docs/learner.md, "Capacity model" and "Pacing (async)".
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from echo_learner.metrics import Timings

EWMA = 0.2
# Forecasts kept per window (one every window_s / FORECASTS_PER_WINDOW
# seconds), and settled forecasts whose errors are averaged.
FORECASTS_PER_WINDOW = 12
ERRORS_KEPT = 60
# The forecast is the model's, anchored to the utilization measured over the
# last CALIBRATION_S seconds (``CapacityMeter.anchored``); the model "now" is
# its mean over the last CURRENT_S seconds, as one step's inputs swing it
# widely. Both chosen on the logged steps of async runs of
# bench/convergence.py (the errors: docs/learner.md, "Capacity model"). No
# forecast is checked before the learner has trained for CALIBRATION_S: the
# first seconds (a backlog of rollouts made while it loaded, the first
# versions spreading) say little about the next minute.
CALIBRATION_S = 20.0
CURRENT_S = 5.0
MIN_MODEL_SAMPLES = 5


def running_mean(old: float, new: float, weight: float = EWMA) -> float:
    """Exponentially weighted mean; the first sample (old == 0) is taken as is."""
    return new if old == 0 else (1 - weight) * old + weight * new


@dataclass(frozen=True)
class Forecast:
    utilization: float
    needed_rollouts_per_s: float
    supply_rollouts_per_s: float
    verdict: str
    model_utilization: float | None = None  # before it was anchored to what this run measured

    def to_json(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class ForecastInputs:
    """What ``forecast`` is fed: the run's settings and what it has measured
    (``Pacing.inputs`` gathers them live; metrics.jsonl and the status API
    show them, in this order)."""

    staleness: int  # S: how many versions a batch may lag; 0 is sync
    publish_every: float  # K: steps per version, measured (at least --publish-every)
    rollouts_per_step: int  # B
    train_s: float  # a training step
    bookkeeping_s: float = 0.0  # the learner's own time per step besides training; 0: a K-th of a publish
    verify_s: float  # the log-prob recompute of B rollouts
    publish_s: float  # building and signing a version
    broadcast_s: float  # publish until a node holds the version
    cycle_s: float  # a node's work cycle: assignment to verdict
    supply_rps: float  # R: the swarm's rollouts per second
    cpu_s: float = 0.0  # the learner process's CPU time per step, all threads
    cores: int = 1  # the cores the learner may run on

    def to_json(self) -> dict:
        return asdict(self)


def forecast(inputs: ForecastInputs) -> Forecast:
    """The learner's utilization and the rollout rate it needs, by the
    formulas of the module's docstring, with a verdict in words."""
    x = inputs  # short: the formulas read as in the module's docstring
    # The learner's own time per step: training, then publishing and
    # checkpoints (measured per step; before that, a K-th of a publish).
    busy = x.train_s + (x.bookkeeping_s or x.publish_s / x.publish_every)
    needed = x.rollouts_per_step / busy if busy > 0 else 0.0
    generate_s = x.rollouts_per_step / x.supply_rps if x.supply_rps > 0 else float("inf")
    verify_bound = (busy + x.verify_s) / 2 if x.verify_s > busy else busy  # see the module's docstring
    cpu_bound = x.cpu_s / max(x.cores, 1)
    trip = (x.broadcast_s + x.cycle_s) / (x.publish_every * x.staleness) if x.staleness > 0 else 0.0
    if x.staleness == 0:
        period = x.train_s + max(x.publish_s, x.bookkeeping_s) + x.broadcast_s + generate_s
    else:
        period = max(busy, verify_bound, generate_s, trip, cpu_bound)
    utilization = min(1.0, x.train_s / period) if period > 0 else 0.0
    trip_bound = x.staleness > 0 and period == trip > max(busy, verify_bound, generate_s)
    if trip_bound:
        k = math.ceil((x.broadcast_s + x.cycle_s) / (x.staleness * busy))
        verdict = (
            f"versions spread slower than the staleness window allows: "
            f"publish every {k} steps (--publish-every) or raise --staleness"
        )
    elif x.staleness > 0 and period == cpu_bound > max(busy, verify_bound, generate_s):
        verdict = (
            f"the learner's {x.cores} core(s) are saturated: {x.cpu_s:.2f} CPU-s a step against {x.train_s:.2f} s "
            f"of training (more cores for the learner, or verification on another device)"
        )
    elif x.staleness > 0 and period == verify_bound and x.verify_s > busy:
        verdict = (
            f"verifying a batch takes {x.verify_s:.2f} s, a step {busy:.2f} s: the log-prob recompute holds "
            f"the learner back (a faster or a separate device for it)"
        )
    elif x.supply_rps <= 0:
        verdict = "no rollout throughput measured yet"
    elif x.supply_rps >= needed:
        verdict = f"enough rollout throughput ({x.supply_rps / needed:.1f}x what keeps the learner busy)"
    else:
        verdict = f"needs {needed / x.supply_rps:.1f}x more rollout throughput to keep the learner busy"
    return Forecast(utilization, needed, x.supply_rps, verdict)


def publish_due(*, publish_every: int, steps_since: int, since_publish_s: float, broadcast_s: float) -> bool:
    """Async pacing: publish after ``publish_every`` steps, and no sooner than
    a version takes to reach the nodes (``broadcast_s``, measured): versions
    published faster than they spread only make nodes generate with versions
    ever further behind, whose batches then fall out of the staleness window."""
    return steps_since >= publish_every and since_publish_s >= broadcast_s


def window_left_s(
    *,
    version: int,
    current: int,
    staleness: int,
    publish_every: int,
    steps_since: int,
    step_period_s: float,
    since_publish_s: float = 0.0,
    broadcast_s: float = 0.0,
) -> float:
    """Seconds at least until ``version`` leaves the staleness window: it
    leaves when version + staleness + 1 is published. Publishing is paced
    (``publish_due``): after ``publish_every`` steps of ``step_period_s``,
    and no sooner than ``broadcast_s`` after the last publish. The step under
    way may end at any moment, so it counts as done (counted as a whole step
    to come, honest batches were refused just after their prompts were handed
    out: the publish came at the end of that step; docs/learner.md, "Pacing (async)")."""
    publishes = version + staleness - current + 1
    if publishes <= 0:
        return 0.0
    next_publish = max((publish_every - steps_since - 1) * step_period_s, broadcast_s - since_publish_s, 0.0)
    per_version = max(publish_every * step_period_s, broadcast_s)
    return next_publish + (publishes - 1) * per_version


class CapacityMeter:
    """Where the learner's timings land: running means for the capacity
    model, and ``timings``' histograms (``echo_learner.metrics``) for /metrics."""

    def __init__(self, window_s: float, timings: Timings | None = None):
        self.window_s = window_s
        self.timings = timings
        self.started = time.monotonic()
        self.train_s = 0.0
        self.bookkeeping_s = 0.0  # per step, after training: publishing, checkpoints
        # Per step, everything but waiting for rollouts: training, bookkeeping,
        # and what the loop does between steps (step records, and the event
        # loop's own work on the same cores: taking in and scoring rollouts).
        self.own_s = 0.0
        # The learner's pace: seconds from one step's start to the next's
        # (training plus waiting for rollouts), and steps since the last publish.
        self.step_period_s = 0.0
        # The learner process's CPU time per step, all threads (training,
        # verification, the event loop): on its cores, a floor on the period.
        self.cpu_s = 0.0
        self._last_cpu = 0.0
        self.steps_since_publish = 0
        self.steps_per_version = 0.0  # measured: publishing is paced (see Learner.publish_due)
        self.last_published = 0.0
        self._last_start = 0.0
        self.publish_s = 0.0
        self.broadcast_s = 0.0
        self.verify_s_per_rollout = 0.0
        self._busy: deque[tuple[float, float]] = deque()  # (start, end) of train steps
        self._first_step: float | None = None
        self._models: deque[tuple[float, float]] = deque()  # (time, the model's utilization) per step
        self._forecasts: deque[tuple[float, float]] = deque()  # (made at, utilization) not yet settled
        self._errors: deque[float] = deque(maxlen=ERRORS_KEPT)
        self.last_settled: tuple[float, float] | None = None  # (forecast, measured)
        self._published: dict[int, float] = {}  # version -> monotonic time
        # (peer, version) -> seconds from publishing the version until the peer held it
        self._arrived: dict[tuple[str, int], float] = {}

    def on_train(self, start: float, end: float, waited: float = 0.0) -> None:
        """A training step ran from ``start`` to ``end``, after waiting ``waited``
        seconds for its batch."""
        self.train_s = running_mean(self.train_s, end - start)
        if self.timings:
            self.timings.train_step.observe(end - start)
        cpu = time.process_time()
        if self._last_start:
            self.step_period_s = running_mean(self.step_period_s, start - self._last_start)
            self.own_s = running_mean(self.own_s, max(0.0, start - self._last_start - waited))
            self.cpu_s = running_mean(self.cpu_s, cpu - self._last_cpu)
        self._last_start, self._last_cpu = start, cpu
        if self._first_step is None:
            self._first_step = start
        self.steps_since_publish += 1
        self._busy.append((start, end))
        # Kept two windows: a forecast made a window ago is settled over them.
        while self._busy and self._busy[0][1] < end - 2 * self.window_s:
            self._busy.popleft()

    @property
    def overhead_s(self) -> float:
        """The learner's own time per step beyond training: bookkeeping, or
        more if the loop spends more between steps (measured as the step
        period less the waits for rollouts)."""
        return max(self.bookkeeping_s, self.own_s - self.train_s)

    def on_bookkeeping(self, seconds: float) -> None:
        """After a step, the learner spent ``seconds`` publishing and checkpointing."""
        self.bookkeeping_s = running_mean(self.bookkeeping_s, seconds)

    def on_verify(self, seconds: float, rollouts: int) -> None:
        """A log-prob recompute pass over ``rollouts`` rollouts (one batch or several) took ``seconds``."""
        self.verify_s_per_rollout = running_mean(self.verify_s_per_rollout, seconds / max(rollouts, 1))
        if self.timings:
            self.timings.verify.observe(seconds)

    def on_publish(self, version: int, start: float, end: float) -> None:
        self.publish_s = running_mean(self.publish_s, end - start)
        if self.steps_since_publish:
            self.steps_per_version = running_mean(self.steps_per_version, self.steps_since_publish)
        self.steps_since_publish = 0
        self.last_published = end
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
        if self.timings:
            self.timings.broadcast.observe(elapsed)

    def holders(self, version: int) -> set[str]:
        """Peers whose Have showed all of ``version``."""
        return {p for p, v in self._arrived if v == version}

    def spread_s(self, version: int) -> float | None:
        """Seconds from publishing ``version`` until the latest node that holds it
        got it (None before any node has it)."""
        return max((s for (_, v), s in self._arrived.items() if v == version), default=None)

    def utilization(self, now: float | None = None) -> float:
        """Fraction of the last ``window_s`` seconds spent in training steps."""
        now = time.monotonic() if now is None else now
        return self._busy_fraction(max(self.started, now - self.window_s), now)

    def _busy_fraction(self, start: float, end: float) -> float:
        busy = sum(max(0.0, min(e, end) - max(s, start)) for s, e in self._busy)
        return busy / (end - start) if end > start else 0.0

    def on_model(self, utilization: float, now: float | None = None) -> None:
        """After a step, the capacity model (``forecast``) said ``utilization``."""
        now = time.monotonic() if now is None else now
        self._models.append((now, utilization))
        while self._models[0][0] < now - CALIBRATION_S:
            self._models.popleft()

    def anchored(self, now: float | None = None) -> float | None:
        """The utilization to forecast for the next window: the one measured
        over the last CALIBRATION_S seconds, moved as far as the model has
        moved since (its mean over the last CURRENT_S seconds against its mean
        over the CALIBRATION_S). The model's max() of mean times misses how
        the learner's stages queue behind each other on shared cores (it
        forecasts too high: docs/learner.md, "Capacity model"); the
        measurement holds that, the model what changes. None (then the model alone) in the
        learner's first CALIBRATION_S seconds of training, or with fewer than
        MIN_MODEL_SAMPLES steps in the last CALIBRATION_S."""
        now = time.monotonic() if now is None else now
        recent = [u for t, u in self._models if t >= now - CALIBRATION_S]
        current = [u for t, u in self._models if t >= now - CURRENT_S]
        if self._first_step is None or now - self._first_step < CALIBRATION_S:
            return None
        if len(recent) < MIN_MODEL_SAMPLES or not current:
            return None
        if fmean(recent) <= 0:
            return fmean(current)
        measured = self._busy_fraction(max(self._first_step, now - CALIBRATION_S), now)
        return min(1.0, measured * fmean(current) / fmean(recent))

    def on_forecast(self, utilization: float, now: float | None = None) -> None:
        """The model forecasts ``utilization`` over the next ``window_s``
        seconds; kept (at most one per ``window_s / FORECASTS_PER_WINDOW``)
        until they have passed. Also settles the forecasts that are due."""
        now = time.monotonic() if now is None else now
        self.settle(now)
        if not self._forecasts or now - self._forecasts[-1][0] >= self.window_s / FORECASTS_PER_WINDOW:
            self._forecasts.append((now, utilization))

    def settle(self, now: float | None = None) -> None:
        """Compare each forecast whose window has passed with what happened."""
        now = time.monotonic() if now is None else now
        while self._forecasts and self._forecasts[0][0] + self.window_s <= now:
            made, predicted = self._forecasts.popleft()
            measured = self._busy_fraction(made, made + self.window_s)
            self._errors.append(abs(predicted - measured))
            self.last_settled = (predicted, measured)

    def forecast_error(self) -> float | None:
        """Mean absolute error of the recent settled forecasts (None: none yet)."""
        return sum(self._errors) / len(self._errors) if self._errors else None
