"""How long Python's cyclic collector stopped the process, by generation.

A collector pass runs on whatever thread allocates, the event loop's
included, and stops every task for its length: a full pass over a learner
holding a thousand peers, or an emulator holding 250 identities, took up to
1.5 s (docs/learner.md, "Many volunteers"). ``GcPauses`` times each pass
through ``gc.callbacks`` (two ``perf_counter`` calls a pass) so that a late
loop can be told apart from a busy one; ``freeze_heap`` keeps such passes
short.
"""

from __future__ import annotations

import gc
import time
from collections import Counter

# Allocations between passes over the youngest generation (Python's: 700),
# the learner's --gc-young default: objects made for one request die before
# a pass sees them, and fewer reach the full passes.
YOUNG_EVERY = 50_000


def freeze_heap(young_every: int = YOUNG_EVERY) -> None:
    """Take what is alive now out of every later pass (it lives as long as the
    process: models, hosts, connections), and pass over the youngest
    generation every ``young_every`` allocations from now on."""
    gc.freeze()
    gc.set_threshold(young_every, *gc.get_threshold()[1:])


class GcPauses:
    """Counts and times the collector's passes from ``start()`` until ``stop()``."""

    def __init__(self) -> None:
        self.ms: Counter[int] = Counter()  # time in passes, by generation
        self.passes: Counter[int] = Counter()
        self.max_ms = 0.0
        self._started = 0.0

    def start(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def reset(self) -> None:
        self.ms.clear()
        self.passes.clear()
        self.max_ms = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took_ms = (time.perf_counter() - self._started) * 1000
        generation = info["generation"]
        self.ms[generation] += took_ms
        self.passes[generation] += 1
        self.max_ms = max(self.max_ms, took_ms)

    def to_json(self) -> dict:
        return {
            "gc_ms": {str(g): round(ms, 1) for g, ms in sorted(self.ms.items())},
            "gc_passes": {str(g): n for g, n in sorted(self.passes.items())},
            "gc_max_ms": round(self.max_ms, 1),
        }
