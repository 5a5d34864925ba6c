"""Work sized to each node: as many prompts as it finishes well inside the deadline."""

from hypothesis import given
from hypothesis import strategies as st

from echo_learner.sizing import DEADLINE_SHARE, prompts_for


def test_fast_nodes_get_many_slow_ones_one_group_newcomers_one():
    assert prompts_for(0.0, 32, 16, cap=64) == 1  # not measured yet
    assert prompts_for(0.5, 32, 16, cap=64) == 1  # a slow laptop: one group
    assert prompts_for(8.0, 62, 8, cap=64) == 31  # 31 groups of 8 at 8 rollouts/s: 31 s of a 62 s deadline
    assert prompts_for(10_000.0, 32, 16, cap=64) == 64  # a GPU: the cap
    # What a node still holds counts: a prefetching node never queues past the deadline.
    assert prompts_for(8.0, 62, 8, cap=64, held=30) == 1
    assert prompts_for(8.0, 62, 8, cap=64, held=31) == 0


@given(
    rate=st.floats(0.001, 1e5), deadline=st.floats(1, 3600), group=st.integers(1, 64), cap=st.integers(1, 256),
    held=st.integers(0, 300),
)
def test_what_a_node_holds_never_outlasts_its_share_of_the_deadline(rate, deadline, group, cap, held):
    n = prompts_for(rate, deadline, group, cap, held)
    assert 0 <= n <= cap
    # One group is always allowed to a node holding nothing; beyond it, all
    # it holds fits the deadline's share.
    assert (held == 0 and n == 1) or n == 0 or (held + n) * group / rate <= deadline * DEADLINE_SHARE
    assert prompts_for(0.0, deadline, group, cap, held) == 1  # not measured yet: one group per request


def test_a_step_is_shared_in_proportion_to_throughput():
    """A 2000, a 500 and two 100 tokens/s node on a pool of 16 prompts: each
    gets its throughput share (rounded up), so they finish a step together."""
    rates = [500.0, 125.0, 25.0, 25.0]
    got = [prompts_for(r, 8, 16, cap=16, swarm_rate=sum(rates), pool=16) for r in rates]
    assert got == [12, 3, 1, 1]
    # Alone, a node takes what its deadline allows, up to the cap.
    assert prompts_for(500.0, 8, 16, cap=16, swarm_rate=500.0, pool=16) == 16
