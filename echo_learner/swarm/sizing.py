"""How many prompts to hand a node at once (ECHO-2's cost-aware activation,
made deadline-aware), from the throughput the learner measured for it
(``PeerStats.rate``, re-measured with every accepted batch):

- what it finishes by the time the round ends: the round's prompts not
  handed out yet go, in the learner's model of it, to whichever node is free
  first, each node working through what it already holds at its measured
  rate, so that the nodes working on a step finish it together instead of
  the step waiting on a slow node's big assignment; but one group in each
  round at the least, so that every node takes part (late in a round, a
  node that already had its share waits rather than hold the step up with
  one more prompt);
- never more than it finishes, with what it already holds, in half the
  assignment deadline: nothing expires because it was over-assigned.

A fast GPU node gets many, a slow laptop one group, a node not measured yet
one group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The share of the deadline a node's measured pace may fill with all it
# holds: the rest is room for a slower spell and the round trips.
DEADLINE_SHARE = 0.5


@dataclass(frozen=True)
class Worker:
    """A measured node as the round's model sees it."""

    rate: float  # prompts per second (its rollouts/s over the group size)
    busy_s: float  # until it has finished the prompts it holds


def round_end_s(workers: Sequence[Worker], unassigned: int) -> float:
    """Seconds until every prompt of the round is done, if the ``unassigned``
    ones go to whichever worker is free first (water-filling), and no sooner
    than some worker could finish one more (prompts are whole: otherwise
    nobody would take the round's last one) nor than every worker has
    finished what it holds."""
    assert workers and all(w.rate > 0 for w in workers)
    left, now, draining = float(unassigned), 0.0, 0.0  # prompts, seconds, prompts/s
    for w in sorted(workers, key=lambda w: w.busy_s):
        if draining and now + left / draining <= w.busy_s:
            break
        left -= draining * (w.busy_s - now)
        now, draining = w.busy_s, draining + w.rate
    fluid = now + max(0.0, left) / draining
    return max(fluid, max(w.busy_s for w in workers), min(w.busy_s + 1 / w.rate for w in workers))


def prompts_for(
    rate: float,
    deadline_s: float,
    group_size: int,
    cap: int,
    held: int = 0,
    busy_s: float = 0.0,
    round_ends_in_s: float | None = None,
    handed_this_round: int = 0,
) -> int:
    """More prompts for a node generating ``rate`` rollouts/s (0: not
    measured yet: one group per request) that holds ``held`` unanswered ones,
    busy for ``busy_s`` more seconds (nodes ask for their next assignment
    while they generate), in a swarm whose round ends in ``round_ends_in_s``
    (``round_end_s`` of its measured workers, this one among them; None:
    size by the deadline alone), of which it was handed
    ``handed_this_round``. At most ``cap`` at once; 0 when what it holds
    already fills its time."""
    if rate <= 0:
        return 1  # what newcomers hold together is bounded by fairness.room
    budget = max(1, int(rate * deadline_s * DEADLINE_SHARE / group_size)) - held
    if round_ends_in_s is not None:
        free_s = round_ends_in_s - busy_s
        # 1e-6: times on trio's clock (a large random offset) are good to a
        # few 1e-11 s, a share of a fast node's 10 ms prompt to a few 1e-9.
        share = int(rate / group_size * free_s + 1e-6)
        budget = min(budget, share if handed_this_round else max(1, share))
    return max(0, min(cap, budget))
