"""How many prompts one peer may hold at a time: a fair share of the pool.

Prompts are the learner's scarce resource: the pool holds only what the next
training steps need. Without a limit, one peer keeping many work requests in
flight (or a crowd of fresh identities each asking once) takes every prompt
and honest nodes get none. So, counting only prompts handed out and not yet
answered or expired:

- each peer holds at most a fair share: the pool divided among the peers that
  asked for work recently, and never less than one request's worth;
- peers that have never had a batch accepted (newcomers, which cost an
  attacker nothing to make) share ``newcomer_share`` of the pool between them
  while any proven peer is asking, on top of the pool (the prompt pool does
  not count what they hold, so a step never waits on them); proven peers
  then divide the pool among themselves alone, so a crowd of newcomers does
  not shrink their shares. With no proven peer around (a swarm that is just
  starting) newcomers are not held back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection


def room(
    peer: str,
    *,
    capacity: int,
    per_request: int,
    newcomer_share: float,
    active: Collection[str],
    proven: Collection[str],
    held: Counter[str],
    newcomers_hold: int | None = None,
) -> int:
    """How many more prompts ``peer`` may be handed now.

    ``active``: peers that asked for work recently (``peer`` among them, or
    counted as if it were); ``proven``: those of them with at least one
    accepted batch; ``held``: live (unanswered, unexpired) prompts per peer;
    ``newcomers_hold``: what the peers not in ``proven`` hold together, if
    the caller has it (else summed from ``held``). A learner asks on every
    work request: pass sets, nothing here copies them.
    """
    if peer in proven:
        sharers = len(proven)
    else:
        sharers = len(active) + (peer not in active)
    fair = max(per_request, -(-capacity // sharers))
    left = fair - held[peer]
    if peer not in proven and proven:
        newcomers_cap = max(per_request, int(capacity * newcomer_share))
        if newcomers_hold is None:
            newcomers_hold = sum(n for p, n in held.items() if p not in proven)
        left = min(left, newcomers_cap - newcomers_hold)
    return max(0, left)
