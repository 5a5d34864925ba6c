"""Work sized to each node: as many prompts as it finishes well inside the deadline."""

from hypothesis import given
from hypothesis import strategies as st

from echo_learner.swarm.sizing import DEADLINE_SHARE, Worker, prompts_for, round_end_s


def test_fast_nodes_get_many_slow_ones_one_group_newcomers_one():
    assert prompts_for(0.0, 32, 16, cap=64) == 1  # not measured yet
    assert prompts_for(0.5, 32, 16, cap=64) == 1  # a slow laptop: one group
    assert prompts_for(8.0, 62, 8, cap=64) == 31  # 31 groups of 8 at 8 rollouts/s: 31 s of a 62 s deadline
    assert prompts_for(10_000.0, 32, 16, cap=64) == 64  # a GPU: the cap
    # What a node still holds counts: a prefetching node never queues past the deadline.
    assert prompts_for(8.0, 62, 8, cap=64, held=30) == 1
    assert prompts_for(8.0, 62, 8, cap=64, held=31) == 0


@given(
    rate=st.floats(0.001, 1e5),
    deadline=st.floats(1, 3600),
    group=st.integers(1, 64),
    cap=st.integers(1, 256),
    held=st.integers(0, 300),
)
def test_what_a_node_holds_never_outlasts_its_share_of_the_deadline(rate, deadline, group, cap, held):
    n = prompts_for(rate, deadline, group, cap, held)
    assert 0 <= n <= cap
    # One group is always allowed to a node holding nothing; beyond it, all
    # it holds fits the deadline's share.
    assert (held == 0 and n == 1) or n == 0 or (held + n) * group / rate <= deadline * DEADLINE_SHARE
    assert prompts_for(0.0, deadline, group, cap, held) == 1  # not measured yet: one group per request


def workers(rates, busy=None, group=16):
    return [Worker(r / group, b) for r, b in zip(rates, busy or [0.0] * len(rates))]


def test_a_step_is_shared_so_that_its_nodes_finish_together():
    """A 2000, a 500 and two 100 tokens/s node (500, 125, 25, 25 rollouts/s
    in groups of 16) on a step of 64 prompts: the swarm would finish it in
    1.52 s, so each node gets what it finishes by then."""
    rates = [500.0, 125.0, 25.0, 25.0]
    swarm = workers(rates)
    assert round(round_end_s(swarm, 64), 3) == 1.517
    got = [prompts_for(r, 8, 16, cap=64, round_ends_in_s=round_end_s(swarm, 64)) for r in rates]
    assert got == [47, 11, 2, 2]
    # Alone, a node takes what its deadline allows, up to the cap.
    assert prompts_for(500.0, 8, 16, cap=16, round_ends_in_s=round_end_s(workers([500.0]), 64)) == 16
    # What it holds counts against its share.
    assert (
        prompts_for(
            125.0,
            8,
            16,
            cap=64,
            held=8,
            busy_s=8 / 7.8125,
            round_ends_in_s=round_end_s(workers(rates, [0, 8 / 7.8125, 0, 0]), 56),
        )
        == 3
    )


def test_late_in_a_step_a_slow_node_that_had_its_share_waits():
    """The fast node holds 16 prompts (0.5 s of work), the middle one 2
    (0.26 s), 4 are not handed out: the step can end at 0.52 s, so one more
    prompt for a slow node (0.64 s) would hold it up: it waits; the middle
    node takes 2, and the fast one the rest once it is nearly free."""
    rates = [500.0, 125.0, 25.0, 25.0]
    swarm = workers(rates, [0.512, 0.256, 0.0, 0.0])
    assert round(round_end_s(swarm, 4), 2) == 0.52
    assert prompts_for(25.0, 8, 16, cap=64, round_ends_in_s=round_end_s(swarm, 4), handed_this_round=2) == 0
    assert (
        prompts_for(
            125.0, 8, 16, cap=64, held=2, busy_s=0.256, round_ends_in_s=round_end_s(swarm, 4), handed_this_round=8
        )
        == 2
    )
    swarm = workers(rates, [0.512, 0.512, 0.0, 0.0])
    assert (
        prompts_for(
            500.0, 8, 16, cap=64, held=16, busy_s=0.512, round_ends_in_s=round_end_s(swarm, 2), handed_this_round=32
        )
        == 1
    )
    # But every node gets one group each round, however slow.
    assert prompts_for(25.0, 8, 16, cap=64, round_ends_in_s=round_end_s(swarm, 4)) == 1
    assert prompts_for(1.0, 8, 16, cap=64, round_ends_in_s=round_end_s(workers([1000.0, 1.0]), 2)) == 1
    # While another node is busy longer anyway, a slow one may fill the time.
    swarm = workers(rates, [0.1, 2.0, 0.0, 0.0])
    assert prompts_for(25.0, 8, 16, cap=64, round_ends_in_s=round_end_s(swarm, 10), handed_this_round=2) == 3
    # The round's last prompt still goes to someone: nodes alike each may take it.
    assert (
        prompts_for(100.0, 8, 16, cap=64, round_ends_in_s=round_end_s(workers([100.0] * 4), 1), handed_this_round=4)
        == 1
    )


@given(
    rates=st.lists(st.floats(0.01, 1e4), min_size=1, max_size=8),
    busy=st.lists(st.floats(0, 100), min_size=8, max_size=8),
    unassigned=st.integers(0, 512),
)
def test_the_round_model_ends_when_every_prompt_is_done(rates, busy, unassigned):
    swarm = [Worker(r, b) for r, b in zip(rates, busy)]
    end = round_end_s(swarm, unassigned)
    assert end >= max(w.busy_s for w in swarm)
    # By then the workers can do what is not handed out yet (as a fluid).
    assert sum(max(0.0, w.rate * (end - w.busy_s)) for w in swarm) >= unassigned * (1 - 1e-9)
    # And someone can take one more prompt: the round always progresses.
    assert any(w.rate * (end - w.busy_s) >= 1 - 1e-9 for w in swarm)
    for w in swarm:
        n = prompts_for(
            w.rate * 16,
            3600,
            16,
            cap=512,
            busy_s=w.busy_s,
            round_ends_in_s=round_end_s(swarm, unassigned),
            handed_this_round=1,
        )
        assert w.busy_s + n / w.rate <= end * (1 + 1e-9)  # never past the round's end
