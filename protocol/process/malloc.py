"""Keep glibc's allocator from hoarding memory the process has freed.

glibc gives every thread that allocates concurrently an arena of its own (up
to 8 per core) and keeps what is freed there for reuse by that arena. The
learner computes in worker threads (training steps, log-prob recomputes,
held-out scoring), each allocating and freeing GBs of logits: on SmolLM2 its
resident memory climbed to 17 GiB within 26 steps and the kernel killed it,
while one thread's peak is under 4 GiB. With two arenas it stays at
6-7 GiB (measured with a learner and two nodes on 2 cores).
"""

from __future__ import annotations

import ctypes
import sys

M_ARENA_MAX = -8  # mallopt parameter, from glibc's malloc.h


def limit_arenas(arenas: int = 2) -> None:
    """At most ``arenas`` malloc arenas from now on; call before threads start.
    Does nothing off glibc (musl keeps one arena anyway; other systems differ)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        return
