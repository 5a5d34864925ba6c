"""Where the learner's CPU goes, per accepted batch.

Each phase is metered in the CPU time of the thread that runs it
(``time.thread_time``), and only around code that does not await: a trio
task's wall time between awaits includes every other task's work. What no
phase covers (the event loop, libp2p's Noise and yamux, the status API,
serving chunks) is ``other``: the process's CPU time less the phases'. Shown in
``/api/status`` under ``load`` (bench/swarm_load.py reads it).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

# The phases of taking in one batch, in the order they happen, training, and
# building a version to publish (exporting, chunking, hashing and signing it).
PHASES = ("decode", "signature", "recompute", "receipt", "ledger", "train", "publish")


class CpuSplit:
    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.accepted = 0
        self._started = time.process_time()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Meter the block (which must not await) as ``name``."""
        assert name in PHASES, name
        started = time.thread_time()
        try:
            yield
        finally:
            self.seconds[name] += time.thread_time() - started

    def add(self, name: str, seconds: float) -> None:
        """``seconds`` of CPU spent in ``name`` elsewhere (a worker thread)."""
        assert name in PHASES, name
        self.seconds[name] += seconds

    def timed(self, name: str, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` metered as ``name``: for a worker thread."""
        with self.phase(name):
            return fn(*args)

    def to_json(self) -> dict:
        """CPU milliseconds per accepted batch, by phase, since start."""
        total = time.process_time() - self._started
        per = 1000 / max(self.accepted, 1)
        split = {name: round(self.seconds[name] * per, 3) for name in PHASES}
        split["other"] = round(max(0.0, total - sum(self.seconds.values())) * per, 3)
        return {"accepted_batches": self.accepted, "cpu_s": round(total, 3), "cpu_ms_per_batch": split}
