"""Each refusal reason, checked against a real round and a real SQLite ledger."""

import dataclasses

import pytest

from echo_learner import verify as v
from echo_learner.ledger import Ledger, Row
from echo_learner.rounds import Round, Slot
from echo_learner.tasks import TaskPrompt
from protocol.messages import Completion, RolloutGroup
from tests.protocol.samples import LEARNER, NODE, batch

LIMITS = v.Limits(job_id="reverse-test", vocab_size=259, group_size=2, max_new_tokens=4)


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield ledger
    ledger.close()


def open_round(version=3):
    round_ = Round(version, [Slot(7, TaskPrompt("abc=", "cba"), (257, 97, 98, 99, 61))], 30.0)
    assert [s.prompt_id for s in round_.take(NODE.peer_id_str, 4)] == [7]
    return round_


def group(*token_lists, prompt_id=7):
    return RolloutGroup(prompt_id, tuple(Completion(t, tuple(-0.5 for _ in t)) for t in token_lists))


GOOD = group((99, 98, 97, 258), (97, 258))


async def test_honest_batch_passes(ledger):
    assert v.check_batch(batch(groups=(GOOD,)), NODE.peer_id_str, open_round(), ledger, LIMITS) is None


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: batch(identity=LEARNER, groups=(GOOD,)), v.WRONG_SIGNER),
        (lambda: dataclasses.replace(batch(groups=(GOOD,)), generate_ms=99), v.BAD_SIGNATURE),
        (lambda: batch(groups=(GOOD,), job_id="other-job"), v.WRONG_JOB),
        (lambda: batch(groups=(GOOD,), version=2), v.STALE_VERSION),
        (lambda: batch(groups=(group((97, 258), (97,), prompt_id=8),)), v.NOT_ASSIGNED),
        (lambda: batch(groups=(GOOD, GOOD)), v.NOT_ASSIGNED),
        (lambda: batch(groups=(group((97, 258)),)), v.BAD_GROUP),
        (lambda: batch(groups=(group((97, 258), (97, 98, 99, 100, 101)),)), v.BAD_TOKENS),
        (lambda: batch(groups=(group((97, 258), (300,)),)), v.BAD_TOKENS),
        (lambda: batch(groups=(group((97, 258), ()),)), v.BAD_TOKENS),
    ],
)
async def test_refusals(ledger, make, reason):
    assert v.check_batch(make(), NODE.peer_id_str, open_round(), ledger, LIMITS) == reason


async def test_replayed_nonce_is_refused(ledger):
    accepted = batch(groups=(GOOD,))
    ledger.record(Row(b"h" * 32, NODE.peer_id_str, 3, accepted.nonce, 2, 6, "accepted", "ok", 6.0, 1, b""))
    assert v.check_batch(accepted, NODE.peer_id_str, open_round(), ledger, LIMITS) == v.REPLAYED


async def test_prompts_of_another_node_are_refused(ledger):
    round_ = open_round()
    other = batch(identity=LEARNER, groups=(GOOD,))
    assert v.check_batch(other, LEARNER.peer_id_str, round_, ledger, LIMITS) == v.NOT_ASSIGNED


async def test_expired_assignment_goes_to_another_node(autojump_clock):
    import trio

    round_ = Round(0, [Slot(1, TaskPrompt("a=", "a"), (257, 97, 61))], assignment_timeout_s=5)
    assert round_.take("A", 1) and not round_.take("B", 1)
    await trio.sleep(6)
    assert [s.prompt_id for s in round_.take("B", 1)] == [1]
    assert round_.assigned_to("A", 1) is None and round_.assigned_to("B", 1) is not None
