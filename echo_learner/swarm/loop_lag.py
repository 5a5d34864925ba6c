"""How late the learner's event loop runs: the sign that it is at capacity.

Every task of the learner (libp2p's streams and handshakes, work requests,
receipts, the status API) shares one trio loop; when their work outgrows the
CPU, every answer comes late. ``LoopLag`` sleeps a short period again and
again and keeps a running mean of how late it wakes; the learner then turns
new work requests away at once (``--busy-lag-ms``) and keeps serving the
nodes that hold work (bench/swarm_load.py, docs/learner.md).
"""

from __future__ import annotations

import trio


class LoopLag:
    def __init__(self, period_s: float = 0.05, weight: float = 0.2):
        self.period_s = period_s
        self.weight = weight
        # Running mean of how late the loop woke us, from 0: one hiccup (a
        # long synchronous step) moves it by a ``weight`` of itself only.
        self.lag_s = 0.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            start = trio.current_time()
            await trio.sleep(self.period_s)
            late = trio.current_time() - start - self.period_s
            self.lag_s += self.weight * (max(0.0, late) - self.lag_s)
