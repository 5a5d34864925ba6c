"""How many prompts to hand a node at once: as many as it can finish well
inside the assignment deadline at the throughput the learner measured for it
(ECHO-2's cost-aware activation, made deadline-aware). A fast GPU node gets
many, a slow laptop one group, a node not measured yet one group; every
accepted batch re-measures (``PeerStats.rate``)."""

from __future__ import annotations

# The share of the deadline a node's measured pace may fill: the rest is
# room for a slower spell, the round trips and a prefetched second assignment.
DEADLINE_SHARE = 0.5


def prompts_for(rate: float, deadline_s: float, group_size: int, cap: int) -> int:
    """Prompts for a node generating ``rate`` rollouts/s (0: not measured
    yet), never more than ``cap``, never fewer than one group."""
    if rate <= 0:
        return 1
    return max(1, min(cap, int(rate * deadline_s * DEADLINE_SHARE / group_size)))
