"""Work sized to each node: as many prompts as it finishes well inside the deadline."""

from hypothesis import given
from hypothesis import strategies as st

from echo_learner.sizing import DEADLINE_SHARE, prompts_for


def test_fast_nodes_get_many_slow_ones_one_group_newcomers_one():
    assert prompts_for(0.0, 32, 16, cap=64) == 1  # not measured yet
    assert prompts_for(0.5, 32, 16, cap=64) == 1  # a slow laptop: one group
    assert prompts_for(8.0, 62, 8, cap=64) == 31  # 31 groups of 8 at 8 rollouts/s: 31 s of a 62 s deadline
    assert prompts_for(10_000.0, 32, 16, cap=64) == 64  # a GPU: the cap


@given(
    rate=st.floats(0.001, 1e5), deadline=st.floats(1, 3600), group=st.integers(1, 64), cap=st.integers(1, 256)
)
def test_an_assignment_never_outlasts_its_share_of_the_deadline(rate, deadline, group, cap):
    n = prompts_for(rate, deadline, group, cap)
    assert 1 <= n <= cap
    assert n == 1 or n * group / rate <= deadline * DEADLINE_SHARE
