"""Model work yields the CPU to the event loop.

A CPU learner trains and recomputes log-probs in worker threads of the
process whose trio loop answers work requests, batches and the status page.
At one priority, a training step shared the core with the loop, and at 300
volunteers on one core the loop ran 130 ms late while work requests waited
seconds (docs/learner.md, "Many volunteers"). So the threads that run model
work lower their own CPU priority (Linux's per-thread nice value) by
``--model-work-nice``: the loop gets the CPU when it wants it, model work
takes the rest. Like torch's thread count, it is set once for the process
(``set_model_work_nice``, at the learner's start). The threads are trio's
cached workers, so the learner's other background work that lands on them
later (checkpoints) runs at that priority too, which suits it.

Elsewhere (macOS: the nice value is the whole process's) nothing changes.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The highest nice value Linux has.
LOWEST = 19

_by = 0
_lowered = threading.local()


def set_model_work_nice(by: int) -> None:
    """Model work from now on runs ``by`` nice levels below the thread that
    calls it (0: at its priority)."""
    global _by
    _by = by


def lowered(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in this thread, its nice value raised as set (once per thread)."""
    if _by > 0 and sys.platform == "linux" and not getattr(_lowered, "done", False):
        _lowered.done = True
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + _by, LOWEST))
        except OSError:  # a sandbox that forbids it: model work keeps the loop's priority
            pass
    return fn(*args)
