"""Each refusal reason, checked against a real prompt pool and a real SQLite ledger."""

import dataclasses
from functools import partial

import pytest
import trio
import trio.testing

from echo_learner.config import LearnerConfig
from echo_learner.ledger import Ledger, Row
from echo_learner.swarm.capacity import CapacityMeter
from echo_learner.swarm.pool import PromptPool
from echo_learner.tasks.base import TaskPrompt
from echo_learner.verify import verifier as v
from protocol.wire.rollout import Completion, RolloutGroup
from tests.protocol.samples import LEARNER, NODE, batch

LIMITS = v.Limits(job_id="reverse-test", vocab_size=259, group_size=2, max_new_tokens=4, stop_ids=frozenset({258}))
WINDOW = v.Window(3, 3)


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield ledger
    ledger.close()


def prompts():
    n = iter(range(10**6))
    return lambda: (TaskPrompt("abc=", "cba"), (257, 97, 98, 99, 61, next(n) % 2))


def pool_with_prompt_7(capacity=8):
    pool = PromptPool(prompts(), capacity=capacity, assignment_timeout_s=30, memory=64)
    pool.next_prompt_id = 7
    pool.set_open(True)
    assert [a.prompt_id for a in pool.take(NODE.peer_id_str, 1, version=3)] == [7]
    return pool


def group(*token_lists, prompt_id=7):
    return RolloutGroup(prompt_id, tuple(Completion(t, tuple(-0.5 for _ in t)) for t in token_lists))


GOOD = group((99, 98, 97, 258), (97, 258))


def check(b, ledger, sender=NODE.peer_id_str, pool=None, window=WINDOW):
    pool = pool or pool_with_prompt_7()
    return v.check_batch(b, sender, pool, window, lambda n: ledger.nonce_accepted(sender, n), LIMITS)


async def test_honest_batch_passes(ledger):
    assert check(batch(groups=(GOOD,)), ledger) is None


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: batch(identity=LEARNER, groups=(GOOD,)), v.WRONG_SIGNER),
        (lambda: dataclasses.replace(batch(groups=(GOOD,)), generate_ms=99), v.BAD_SIGNATURE),
        (lambda: batch(groups=(GOOD,), job_id="other-job"), v.WRONG_JOB),
        (lambda: batch(groups=(GOOD,), backend="llama", dtype="q4_1"), v.UNSUPPORTED),  # no backend of ours
        (lambda: batch(groups=(GOOD,), backend="torch", dtype="q8_0"), v.UNSUPPORTED),  # for a looser tolerance
        (lambda: batch(groups=(GOOD,), backend="torch", device="vulkan"), v.UNSUPPORTED),  # torch has no Vulkan
        (lambda: batch(groups=(group((97, 258), (97,), prompt_id=8),)), v.NOT_ASSIGNED),
        (lambda: batch(groups=(GOOD, GOOD)), v.NOT_ASSIGNED),
        (lambda: batch(groups=(GOOD,), version=2), v.OUT_OF_WINDOW),
        (lambda: batch(groups=(GOOD,), version=4), v.OUT_OF_WINDOW),
        (lambda: batch(groups=(group((97, 258)),)), v.BAD_GROUP),
        (lambda: batch(groups=(group((97, 258), (97, 98, 99, 100, 101)),)), v.BAD_TOKENS),
        (lambda: batch(groups=(group((97, 258), (300,)),)), v.BAD_TOKENS),
        (lambda: batch(groups=(group((97, 258), ()),)), v.BAD_TOKENS),
        (lambda: batch(groups=(group((97, 258), (97, 258, 98)),)), v.BAD_TOKENS),  # past the stop token
    ],
)
async def test_refusals(ledger, make, reason):
    assert check(make(), ledger) == reason


async def test_versions_inside_the_staleness_window_pass(ledger):
    for version in (1, 2, 3):
        assert check(batch(groups=(GOOD,), version=version), ledger, window=v.Window(1, 3)) is None


async def test_replayed_nonce_is_refused(ledger):
    accepted = batch(groups=(GOOD,))
    ledger.record(
        Row(
            batch_hash=b"h" * 32,
            peer=NODE.peer_id_str,
            version=3,
            nonce=accepted.nonce,
            rollouts=2,
            tokens=6,
            verdict="accepted",
            reason="ok",
            credit=6.0,
            created_ms=1,
            receipt=b"",
        )
    )
    assert check(accepted, ledger) == v.REPLAYED


def verifier_for(config, ledger, pool, policies=None, version=3):
    return v.Verifier(
        config,
        LIMITS,
        pool=pool,
        policies=policies or v.Policies(keep=3),
        ledger=ledger,
        meter=CapacityMeter(60.0),
        pad_id=256,
        current_version=lambda: version,
    )


async def test_a_copy_sent_during_the_log_prob_check_is_replayed(tmp_path, ledger):
    verifier = verifier_for(LearnerConfig(data_dir=tmp_path), ledger, pool_with_prompt_7())
    first = batch(groups=(GOOD,))
    assert await verifier.refusal(first, NODE.peer_id_str, banned=True) == v.BANNED  # before anything else
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(verifier.refusal, first, NODE.peer_id_str, banned=False))  # no recompute runs
        await trio.testing.wait_all_tasks_blocked()
        assert await verifier.refusal(first, NODE.peer_id_str, banned=False) == v.REPLAYED
        nursery.cancel_scope.cancel()


async def test_the_window_holds_only_versions_the_learner_still_has(tmp_path, ledger):
    policies = v.Policies(keep=3)
    policies.add(9, object())
    config = LearnerConfig(data_dir=tmp_path, mode="async", staleness=4)
    assert verifier_for(config, ledger, pool_with_prompt_7(), policies, version=10).window() == v.Window(9, 10)


async def test_prompts_of_another_node_are_refused(ledger):
    other = batch(identity=LEARNER, groups=(GOOD,))
    assert check(other, ledger, sender=LEARNER.peer_id_str) == v.NOT_ASSIGNED


async def test_answered_prompt_is_refused(ledger):
    pool = pool_with_prompt_7()
    pool.answer(pool.lookup(7), None)
    assert check(batch(groups=(GOOD,)), ledger, pool=pool) == v.ANSWERED


async def test_expired_assignment_goes_to_another_node(autojump_clock, ledger):
    pool = PromptPool(prompts(), capacity=1, assignment_timeout_s=5, memory=8)
    pool.set_open(True)
    assert pool.take("A", 1, 0) and not pool.take("B", 1, 0)
    await trio.sleep(6)
    (again,) = pool.take("B", 1, 0)
    assert again.prompt_id == 0 and again.peer == "B" and again.holders == ["A", "B"]


async def test_pool_hands_out_no_more_than_its_capacity_and_refills_as_steps_drain_it():
    pool = PromptPool(prompts(), capacity=4, assignment_timeout_s=30, memory=64)
    assert pool.take("A", 4, 0) == []  # closed until the learner opens it
    pool.set_open(True)
    taken = pool.take("A", 3, 0) + pool.take("B", 3, 0)
    assert len(taken) == 4 and pool.take("C", 1, 0) == []
    for a in taken:
        pool.answer(a, _rollouts(0))
    assert pool.take("C", 1, 0) == []  # four groups wait in the buffer
    assert len(await pool.take_batch(2, min_version=0)) == 2
    assert len(pool.take("C", 4, 0)) == 2


async def test_take_batch_drops_groups_older_than_the_window():
    pool = PromptPool(prompts(), capacity=8, assignment_timeout_s=30, memory=64)
    pool.set_open(True)
    for version, a in zip((1, 5, 2, 6), pool.take("A", 4, 0)):
        pool.answer(a, _rollouts(version))
    got = []
    async with trio.open_nursery() as nursery:

        async def take():
            got.extend(await pool.take_batch(3, min_version=5))

        nursery.start_soon(take)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # only two groups are recent enough
        pool.answer(pool.take("A", 1, 0)[0], _rollouts(7))
    assert [r.version for r in got] == [5, 6, 7]


def _rollouts(version):
    from echo_learner.swarm.pool import Rollouts
    from echo_learner.training.trainer import ScoredGroup

    return Rollouts(version, "A", ScoredGroup((257,), ((97,),), ((-1.0,),), (0.0,)))


def test_policies_keep_the_newest_versions():
    policies = v.Policies(keep=2)
    for version in range(5):
        policies.add(version, object())
    assert sorted(policies.models) == [3, 4]
