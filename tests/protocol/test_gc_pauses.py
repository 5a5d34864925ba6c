"""GcPauses times the cyclic collector's passes while started, and only then."""

import gc

from protocol.process.gc_pauses import GcPauses


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)


def test_passes_are_counted_and_timed_by_generation_while_started():
    pauses = GcPauses().start()
    try:
        _cycles(10_000)
        gc.collect(2)
        gc.collect(0)
        figures = pauses.to_json()
        assert figures["gc_passes"]["2"] >= 1 and figures["gc_passes"]["0"] >= 1
        assert figures["gc_ms"]["2"] > 0 and figures["gc_max_ms"] >= figures["gc_ms"]["2"] / figures["gc_passes"]["2"]
        pauses.reset()
        assert pauses.to_json() == {"gc_ms": {}, "gc_passes": {}, "gc_max_ms": 0.0}
    finally:
        pauses.stop()
    gc.collect(2)
    assert pauses.to_json()["gc_passes"] == {}  # stopped: not counted
    assert pauses._on_gc not in gc.callbacks
