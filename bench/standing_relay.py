"""relay_exhaustion's relay, up from the start of a mode's run, so that its
honest probe is known to it by the relay's own rule when the crowd comes.

The bootstrap's relay keeps part of its slots for *known* peers: those
connected to it for ``known_after_s`` (600 s by default, ``RelayLimits``),
as a node is once it has been in the swarm a while. A scenario lasts ~2
minutes, so the relay_exhaustion scenario cannot hold its probe connected
that long by itself. Instead the bench starts this bootstrap peer and the
probe (bench/relay_probe.py, an honest process of its own) when a mode's
run starts; the scenario, ~20th of its mode, uses this bootstrap as its
swarm's, and waits only for what is left of the 600 s (all of them with
``--only relay_exhaustion``). Each instance serves one scenario: its crowd
has tried, and the probe's reservations are spent.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from attack_catalog import BOOTSTRAP_ENV
from localswarm import LocalSwarm
from relay_probe import ProbeProcess

from protocol.net.relay_server import RelayLimits

KNOWN_AFTER_S = RelayLimits().known_after_s  # the bootstrap's default (echo-bootstrap --relay-known-after-s)


class StandingRelay:
    """A bootstrap peer and the probe connected to it since ``started``."""

    def __init__(self, root: Path, cpus: set[int] | None):
        root.mkdir(parents=True, exist_ok=True)
        self.swarm = LocalSwarm(root, cpus={"bootstrap": cpus} if cpus else {})
        env = BOOTSTRAP_ENV["relay_exhaustion"]
        os.environ.update(env)  # read by the bootstrap alone, started now
        try:
            self.addr = self.swarm.start_bootstrap()
        finally:
            for key in env:
                del os.environ[key]
        self.probe = ProbeProcess(self.addr, KNOWN_AFTER_S, root / "probe.log")
        self.started = time.monotonic()

    def left_s(self) -> float:
        """Seconds until the probe is known (it says so, ``ProbeProcess.known``)."""
        return max(0.0, KNOWN_AFTER_S - (time.monotonic() - self.started))

    def alive(self) -> bool:
        return self.swarm.procs["bootstrap"].poll() is None and self.probe.proc.poll() is None

    def close(self) -> None:
        self.probe.stop()
        self.swarm.stop_all()
