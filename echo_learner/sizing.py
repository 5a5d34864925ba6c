"""How many prompts to hand a node at once (ECHO-2's cost-aware activation,
made deadline-aware), from the throughput the learner measured for it
(``PeerStats.rate``, re-measured with every accepted batch):

- its share of the pool in proportion to its share of the swarm's
  throughput, so that the nodes working on a step finish it together
  instead of the step waiting on a slow node's big assignment;
- never more than it finishes, with what it already holds, in half the
  assignment deadline: nothing expires because it was over-assigned.

A fast GPU node gets many, a slow laptop one group, a node not measured yet
one group."""

from __future__ import annotations

import math

# The share of the deadline a node's measured pace may fill with all it
# holds: the rest is room for a slower spell and the round trips.
DEADLINE_SHARE = 0.5


def prompts_for(
    rate: float, deadline_s: float, group_size: int, cap: int, held: int = 0,
    swarm_rate: float = 0.0, pool: int = 0,
) -> int:
    """More prompts for a node generating ``rate`` rollouts/s (0: not
    measured yet: one group per request) that already holds ``held`` unanswered ones
    (nodes ask for their next assignment while they generate), in a swarm
    generating ``swarm_rate`` rollouts/s in all on a pool of ``pool`` prompts
    (0, 0: no proportional share). At most ``cap`` at once; 0 when what it
    holds already fills its time."""
    if rate <= 0:
        return 1  # what newcomers hold together is bounded by fairness.room
    budget = int(rate * deadline_s * DEADLINE_SHARE / group_size)
    if swarm_rate > 0 and pool > 0:
        budget = min(budget, math.ceil(pool * min(1.0, rate / swarm_rate)))
    return max(0, min(cap, max(1, budget) - held))
