"""The live capacity model of one run, and the publishing pace it sets.

``echo_learner.swarm.capacity`` holds the formulas and the meter; this module feeds
them with what this run has measured so far (the learner's own times, the
nodes' throughput from ``PeerBook``), checks the forecasts against what then
happened, and decides when an async learner publishes the next version.
"""

from __future__ import annotations

import dataclasses
import os
import time

import trio

from echo_learner.config import LearnerConfig
from echo_learner.swarm.capacity import (
    FORECASTS_PER_WINDOW,
    CapacityMeter,
    Forecast,
    ForecastInputs,
    forecast,
    publish_due,
)
from echo_learner.swarm.peers import PeerBook


class Pacing:
    def __init__(self, config: LearnerConfig, meter: CapacityMeter, peers: PeerBook):
        self.config = config
        self.meter = meter
        self.peers = peers
        # The cores this process may run on (pinned: fewer than the machine has).
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    def publish_due(self) -> bool:
        """Publish after every step in sync mode; in async mode paced by
        ``capacity.publish_due`` (unpaced, where versions spread slower than
        steps ran, honest batches were refused as out of the window:
        docs/learner.md, "Pacing (async)")."""
        cfg, meter = self.config, self.meter
        return cfg.mode == "sync" or publish_due(
            publish_every=cfg.publish_every,
            steps_since=meter.steps_since_publish,
            since_publish_s=time.monotonic() - meter.last_published,
            broadcast_s=meter.broadcast_s,
        )

    def on_step(self) -> ForecastInputs:
        """After a step: the model's inputs now, its forecast kept for anchoring."""
        inputs = self.inputs()
        self.meter.on_model(forecast(inputs).utilization)
        return inputs

    def outlook(self, inputs: ForecastInputs | None = None) -> Forecast:
        """The capacity model's forecast from the live ``inputs`` (measured now
        if not given), its utilization anchored to what this run measured
        (``CapacityMeter.anchored``)."""
        model = forecast(self.inputs() if inputs is None else inputs)
        anchored = self.meter.anchored()
        if anchored is None:
            return model
        return dataclasses.replace(model, utilization=anchored, model_utilization=model.utilization)

    def inputs(self) -> ForecastInputs:
        """What the capacity model is fed now."""
        cfg = self.config
        active = self.peers.active(within_s=cfg.capacity_window_s)
        cycles = [p.cycle_s for p in active if p.cycle_s > 0]
        return ForecastInputs(
            staleness=cfg.staleness_in_force,
            publish_every=1 if cfg.mode == "sync" else max(cfg.publish_every, self.meter.steps_per_version),
            rollouts_per_step=cfg.prompts_per_step * cfg.group_size,
            train_s=round(self.meter.train_s, 4),
            bookkeeping_s=round(self.meter.overhead_s, 4),
            verify_s=round(self.meter.verify_s_per_rollout * cfg.prompts_per_step * cfg.group_size, 4),
            publish_s=round(self.meter.publish_s, 4),
            broadcast_s=round(self.meter.broadcast_s, 4),
            cycle_s=round(sum(cycles) / len(cycles), 4) if cycles else 0.0,
            supply_rps=round(sum(p.rate for p in active), 3),
            cpu_s=round(self.meter.cpu_s, 4),
            cores=self.cores,
        )

    def forecast_check(self) -> dict:
        """How the capacity forecasts of this run fared (status, metrics)."""
        error = self.meter.forecast_error()
        last = self.meter.last_settled
        return {
            "forecast_error": None if error is None else round(error, 4),
            "last_forecast": None if last is None else round(last[0], 4),
            "last_measured": None if last is None else round(last[1], 4),
        }

    async def check_forecasts(self) -> None:
        """Every few seconds, forecast the next window's utilization from this
        run's measurements, and check earlier forecasts against what happened
        (``CapacityMeter.on_forecast``). Runs until cancelled."""
        while True:
            outlook = self.outlook()
            # Checked only once anchored to this run's measurements (CapacityMeter.anchored).
            if outlook.model_utilization is not None and outlook.supply_rollouts_per_s > 0:
                self.meter.on_forecast(outlook.utilization)
            else:
                self.meter.settle()
            # A sampling period, not synchronisation.
            await trio.sleep(self.config.capacity_window_s / FORECASTS_PER_WINDOW)
