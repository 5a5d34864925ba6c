"""The prompt pool's bounds: what untried peers hold is extra, never blocking a step."""

import trio

from echo_learner.pool import PromptPool
from echo_learner.tasks.base import TaskPrompt


def pool(capacity: int) -> PromptPool:
    return PromptPool(
        lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)), capacity=capacity, assignment_timeout_s=60, memory=100
    )


async def test_prompts_held_by_provisional_peers_do_not_count_against_capacity():
    p = pool(4)
    p.set_open(True)
    p.provisional = lambda peer: peer.startswith("new")
    assert len(p.take("newcomer", 2, version=0)) == 2  # may never answer
    assert len(p.take("honest", 8, version=0)) == 4  # the step still gets all it needs
    assert p.take("honest2", 8, version=0) == []  # and no more
    assert len(p.take("newcomer2", 2, version=0)) == 2  # newcomers are not crowded out (the learner caps them)


async def test_without_provisional_peers_the_pool_is_bounded_by_capacity():
    p = pool(4)
    p.set_open(True)
    assert len(p.take("a", 3, version=0)) == 3
    assert len(p.take("b", 3, version=0)) == 1


async def test_an_expired_prompt_goes_to_a_proven_peer_not_to_a_newcomer(autojump_clock):
    p = pool(2)
    p.set_open(True)
    p.provisional = lambda peer: peer.startswith("new")
    lapsed = {a.prompt_id for a in p.take("slow", 2, version=0)}
    await trio.sleep(61)  # past the assignment timeout (a mock clock: no real wait)
    assert not lapsed & {a.prompt_id for a in p.take("newcomer", 2, version=0)}
    assert {a.prompt_id for a in p.take("honest", 2, version=0)} == lapsed
