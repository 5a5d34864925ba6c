"""The prompt pool's bounds: what untried peers hold is extra, never blocking a step."""

import math
import random
from collections import Counter

import trio

from echo_learner.swarm.pool import PromptPool
from echo_learner.tasks.base import TaskPrompt


def pool(capacity: int, **wiring) -> PromptPool:
    return PromptPool(
        lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)), capacity=capacity, assignment_timeout_s=60, memory=100, **wiring
    )


class Prefixed:
    """Newcomers: the peers whose names start with ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __contains__(self, peer: object) -> bool:
        return str(peer).startswith(self.prefix)

    def hold(self, held: Counter[str]) -> int:
        return sum(n for peer, n in held.items() if peer in self)


async def test_prompts_held_by_provisional_peers_do_not_count_against_capacity():
    p = pool(4, newcomers=Prefixed("new"))
    p.set_open(True)
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
    p = pool(2, newcomers=Prefixed("new"))
    p.set_open(True)
    lapsed = {a.prompt_id for a in p.take("slow", 2, version=0)}
    await trio.sleep(61)  # past the assignment timeout (a mock clock: no real wait)
    assert not lapsed & {a.prompt_id for a in p.take("newcomer", 2, version=0)}
    assert {a.prompt_id for a in p.take("honest", 2, version=0)} == lapsed


async def test_a_prompt_left_unanswered_lapses_however_many_pass_meanwhile(autojump_clock):
    """Fast steps hand out far more prompts than the pool remembers before a
    hoarder's deadline: its prompt must still be there to lapse (a strike)."""
    lapsed: list[str] = []
    p = PromptPool(
        lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)),
        capacity=4,
        assignment_timeout_s=5,
        memory=20,
        on_lapsed=lapsed.append,
    )
    p.set_open(True)
    p.take("hoarder", 1, version=0)
    for _ in range(50):  # 200 prompts handed out and answered within the deadline
        for a in p.take("honest", 4, version=0):
            p.answer(a, None)
        p.buffer.clear()
        await trio.sleep(0.01)
    assert len(p.assignments) <= 20
    await trio.sleep(5)
    p.take("honest", 1, version=0)
    assert lapsed == ["hoarder"]


async def test_prompts_given_back_go_out_again_at_once_and_do_not_lapse(autojump_clock):
    struck = []
    p = pool(2, on_lapsed=struck.append)
    p.set_open(True)
    given = [a.prompt_id for a in p.take("late", 2, version=0)]
    assert p.take("other", 2, version=0) == []  # all held
    p.release("someone else", given)  # only the holder can give them back
    assert p.take("other", 2, version=0) == []
    p.release("late", given)  # its batch came too late for the window
    assert [a.prompt_id for a in p.take("other", 2, version=1)] == given
    await trio.sleep(61)
    # Lapses are charged when prompts are handed out; the lapsed ones go to a
    # peer that never held them.
    assert [a.prompt_id for a in p.take("third", 2, version=1)] == given
    assert struck == ["other"]  # "late" gave them back in time: no strike for it


async def test_a_prompt_every_asking_peer_let_lapse_does_not_hold_up_the_round(autojump_clock):
    """A lapsed prompt never goes back to a peer that held it; the round's
    slot then gets a fresh prompt instead, so a sync step never waits on it."""
    p = pool(1)
    p.set_open(True)
    [first] = p.take("a", 1, version=0)
    await trio.sleep(61)
    [second] = p.take("b", 1, version=0)
    assert second.prompt_id == first.prompt_id  # the lapsed one goes to the next peer
    await trio.sleep(61)
    [fresh] = p.take("a", 1, version=0)  # both held it: a fresh prompt fills the slot
    assert fresh.prompt_id not in (first.prompt_id, second.prompt_id)


async def test_a_batch_refused_after_the_round_moved_on_is_no_lapse(autojump_clock):
    """Sync mode: the step finished without a slow node's prompt, the round
    moved to the next version, then its batch came and was refused as out of
    the window. It answered: its prompt must not lapse into a strike at the
    deadline (an honest torch node was banned so, bench/models.py)."""
    struck = []
    p = pool(2, on_lapsed=struck.append)
    p.set_open(True)
    given = [a.prompt_id for a in p.take("slow", 1, version=0)]
    p.set_open(True, min_version=1)  # the step was filled by others
    p.release("slow", given)  # its batch, refused: version_out_of_window
    await trio.sleep(61)
    # A take past the deadline is where lapses are charged: it must have run
    # (two fresh prompts; the released one was made for a version now left).
    taken = p.take("other", 2, version=1)
    assert len(taken) == 2 and not {a.prompt_id for a in taken} & set(given)
    assert struck == []


async def test_the_pools_running_counts_follow_every_change(autojump_clock):
    """What each work request asks the pool, kept as it changes rather than
    rescanned: ``unanswered`` is exactly the remembered assignments not yet
    answered, and ``handed``, ``held`` and ``held_since`` say what a full
    scan says, through takes, answers, releases, expiries, forgetting and
    new rounds."""
    import random

    from echo_learner.swarm.pool import Rollouts
    from echo_learner.training.trainer import ScoredGroup

    p = PromptPool(lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)), capacity=6, assignment_timeout_s=5, memory=12)
    p.set_open(True)
    rng = random.Random(0)
    for _ in range(400):
        peer = rng.choice("abcd")
        move = rng.random()
        if move < 0.4:
            p.take(peer, rng.randint(1, 3), version=rng.randint(0, 1))
        elif move < 0.7 and p.unanswered:
            a = rng.choice(list(p.unanswered.values()))
            p.answer(a, Rollouts(0, a.peer, ScoredGroup((1,), ((2,),), ((-1.0,),), (0.0,))))
        elif move < 0.8:
            p.release(peer, list(p.unanswered)[:2])
        elif move < 0.9 and p.buffer:
            p.buffer.popleft()
        elif move < 0.93:
            p.set_open(True, min_version=rng.randint(0, 1))
        else:
            await trio.sleep(rng.uniform(0, 4))
        assert list(p.unanswered) == [pid for pid, a in p.assignments.items() if not a.answered]
        now, live = (
            trio.current_time(),
            [a for a in p.assignments.values() if a.live(trio.current_time(), p.min_version)],
        )
        assert p.held() == Counter(a.peer for a in live)
        assert p.held_since() == {peer: min(a.handed_at for a in live if a.peer == peer) for peer in p.held()}
        assert p.next_expiry() == min((a.deadline for a in live), default=math.inf)
        for peer in "abcd":
            round_ = [a for a in p.assignments.values() if a.version >= p.min_version and peer in a.holders]
            assert p.handed(peer) == len(round_), (peer, now)


async def test_twins_go_to_two_peers_of_one_version_and_both_count():
    counter = iter(range(10**6))
    p = PromptPool(
        lambda: (TaskPrompt(str(next(counter)), ""), (1,)),
        capacity=64,
        assignment_timeout_s=60,
        memory=1000,
        twin_share=0.5,
        rng=random.Random(1),  # unseeded, all 8 or none of 8 were twins 1 run in 128
    )
    p.set_open(True)
    mine = p.take("a", 8, version=0)
    assert all(a.twin in (None, a.prompt_id) for a in mine)  # never a's own twin
    firsts = {a.prompt_id: a.prompt.text for a in mine if a.twin is not None}
    assert 1 <= len(firsts) <= 7, len(firsts)  # some of them, not all (the share is checked below)
    seconds = p.take("b", len(firsts), version=0)
    assert {a.twin: a.prompt.text for a in seconds} == firsts  # b gets them first, the same prompts
    assert p.take("a", 1, version=0)[0].twin in (None, p.next_prompt_id - 1)  # still nothing of a's own

    # A first left over from an older version is not handed out with a newer one.
    p.take("a", 8, version=0)
    assert all(a.twin is None or a.twin == a.prompt_id for a in p.take("b", 8, version=1))

    # The share: of many prompts, about twin_share start a pair; the firsts
    # waiting for their second are bounded by the pool's capacity.
    p = PromptPool(lambda: (TaskPrompt("q", ""), (1,)), capacity=16, assignment_timeout_s=60, memory=10**5,
                   twin_share=0.5, rng=random.Random(3),
                   newcomers=Prefixed(""))  # everyone: handed beyond capacity  # fmt: skip
    p.set_open(True)
    handed = p.take("a", 2000, version=0)
    assert 900 < sum(a.twin is not None for a in handed) < 1100
    assert len(p._firsts) == 16
