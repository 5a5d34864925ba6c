"""The learner's work and rollout handlers: admission control by version, and a
refused batch's prompts going to another node at once."""

import dataclasses
import time
from dataclasses import dataclass

import pytest
import torch
import trio
import trio.testing

from echo_learner.config import LearnerConfig
from echo_learner.ledger import Ledger
from echo_learner.swarm.capacity import CapacityMeter
from echo_learner.swarm.loop_lag import LoopLag
from echo_learner.swarm.peers import PeerBook
from echo_learner.swarm.pool import Rollouts
from echo_learner.swarm.rollout_handler import RolloutHandler
from echo_learner.swarm.work_handler import WorkHandler
from echo_learner.tasks.reverse import ReverseTask
from echo_learner.verify import verifier as v
from protocol.wire.work import NoWork, WorkAssignment
from tests.learner.test_verify import GOOD, LIMITS, pool_with_prompt_7
from tests.protocol.samples import LEARNER, NODE, batch, work_request

REQUEST = work_request(
    job_id=LIMITS.job_id,
    max_prompts=8,
    held_version=8,
    backend="llama",
    dtype="q8_0",
    reachability="public",
    memory_mib=1024,
)


@dataclass
class Handlers:
    work: WorkHandler
    rollouts: RolloutHandler


def ingest_for(config, ledger, pool, policies, peers, meter, version: int) -> Handlers:
    """The learner's handlers for the reverse task, at ``version``."""
    verifier = v.Verifier(
        config,
        LIMITS,
        pool=pool,
        policies=policies,
        ledger=ledger,
        meter=meter,
        pad_id=256,
        current_version=lambda: version,
    )
    return Handlers(
        WorkHandler(config, verifier=verifier, pool=pool, peers=peers, lag=LoopLag()),
        RolloutHandler(
            LEARNER,
            verifier=verifier,
            pool=pool,
            ledger=ledger,
            peers=peers,
            task=ReverseTask(),
            decode=lambda ids: bytes(ids).decode(errors="replace"),
        ),
    )


async def test_a_refused_batch_gives_its_prompts_to_the_next_node_at_once(autojump_clock, tmp_path):
    pool = pool_with_prompt_7()  # prompt 7 held by NODE, for 30 s
    ledger = Ledger(tmp_path / "ledger.sqlite")
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    ingest = ingest_for(
        LearnerConfig(data_dir=tmp_path), ledger, pool, v.Policies(keep=3), peers, CapacityMeter(60.0), 3
    )
    try:
        forged = dataclasses.replace(batch(groups=(GOOD,)), generate_ms=99)  # signature no longer fits
        receipt = await ingest.rollouts.judge(NODE.peer_id_str, forged)
        assert (receipt.verdict, receipt.reason) == ("refused", v.BAD_SIGNATURE)
        # Not 30 s later: now, to the next node that asks.
        assert [a.prompt_id for a in pool.take("honest", 1, version=3)] == [7]
        # The refused node has no claim on them left: another batch for them is a strike too.
        again = await ingest.rollouts.judge(NODE.peer_id_str, batch(groups=(GOOD,)))
        assert (again.verdict, again.reason) == ("refused", v.NOT_ASSIGNED)
        await trio.sleep(31)
        pool.take("third", 1, version=3)  # lapses are charged when prompts are handed out
        assert len(peers.peers[NODE.peer_id_str].strikes) == 2  # the two refusals' strikes, no lapse on top
    finally:
        ledger.close()


def _admission(tmp_path, ledger, *, rate: float) -> Handlers:
    """An async learner at version 10 (window 8-10, publishing every 3 steps
    of 0.2 s, versions spreading in 0.5 s) that measured NODE at ``rate``
    rollouts/s."""
    policies = v.Policies(keep=3)
    for version in (8, 9, 10):
        policies.add(version, torch.nn.Linear(1, 1))
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    peers.seen(NODE.peer_id_str).rate = rate
    meter = CapacityMeter(60.0)
    meter.step_period_s, meter.broadcast_s = 0.2, 0.5
    meter.last_published = time.monotonic() - 10  # long enough ago: only the step count holds a publish back
    config = LearnerConfig(data_dir=tmp_path, mode="async", staleness=2, publish_every=3, group_size=4)
    return ingest_for(config, ledger, pool_with_prompt_7(), policies, peers, meter, 10)  # NODE holds one prompt


def holds(ingest: Handlers) -> int:
    return ingest.work.pool.held()[NODE.peer_id_str]


async def test_a_node_whose_version_leaves_the_window_before_it_could_answer_must_fetch_a_newer_one(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    try:
        ingest = _admission(tmp_path, ledger, rate=400.0)  # 2 prompts of 4: 0.02 s, 0.04 s with the margin
        asks = dataclasses.replace(REQUEST, held_version=8)

        # Two steps since the publish: the one under way may end now and publish
        # version 11, which moves 8 out. Version 9 stays for 3 more steps (0.6 s),
        # enough once fetched (0.5 s): the node must get at least 9.
        ingest.work.meter.steps_since_publish = 2
        assert ingest.work._version_for(NODE.peer_id_str, asks, holds(ingest)) == (9, pytest.approx(0.1))
        # One step since: the next publish is at least a step (0.2 s) away, time
        # enough for 2 prompts: it may go on with what it holds, down to 8.
        ingest.work.meter.steps_since_publish = 1
        assert ingest.work._version_for(NODE.peer_id_str, asks, holds(ingest)) == (8, pytest.approx(0.2))
        # A slower node (2 prompts: 0.2 s, 0.4 s with the margin) would not be back in time.
        ingest.work.peers.peers[NODE.peer_id_str].rate = 40.0
        assert ingest.work._version_for(NODE.peer_id_str, asks, holds(ingest))[0] > 8
    finally:
        ledger.close()


async def test_past_the_waiting_room_a_work_request_is_told_when_to_come_back(autojump_clock, tmp_path):
    """A thousand idle volunteers must not all wait on the pool: each waiting
    request is looked at again at every change. Past --max-waiting-requests
    the answer is an immediate NoWork with a time to come back."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    config = LearnerConfig(data_dir=tmp_path, long_poll_s=30, max_waiting_requests=2)
    ingest = ingest_for(
        config,
        ledger,
        pool_with_prompt_7(capacity=1),
        v.Policies(keep=3),
        PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100),
        CapacityMeter(60.0),
        3,
    )
    answers = {}

    async def ask(peer):
        answers[peer] = (await ingest.work.reply(peer, "direct", REQUEST), trio.current_time())

    try:
        async with trio.open_nursery() as nursery:
            for peer in ("a", "b"):
                nursery.start_soon(ask, peer)
            await trio.testing.wait_all_tasks_blocked()
            await ask("c")  # the room is full: answered at once
            assert set(answers) == {"c"} and answers["c"][1] == 0
            no_work = answers["c"][0]
            assert isinstance(no_work, NoWork) and no_work.reason.startswith("busy")
            # Before a step is measured: about --long-poll-s, spread +-25 %.
            assert 0.75 * 30_000 <= no_work.retry_after_ms <= 1.25 * 30_000
        # The two in the room waited their long poll out, as before.
        assert [(answers[p][0].retry_after_ms, answers[p][1]) for p in "ab"] == [(0, 30), (0, 30)]
    finally:
        ledger.close()


async def test_turned_away_requests_are_told_to_come_back_after_those_ahead_of_them(autojump_clock, tmp_path):
    """Each request turned away for a full waiting room is told to come back
    after the prompts for those ahead of it (the waiting ones and those
    turned away before it, not back yet) are out, at the measured pace."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    config = LearnerConfig(data_dir=tmp_path, long_poll_s=30, max_waiting_requests=2, prompts_per_step=2)
    meter = CapacityMeter(60.0)
    meter.step_period_s = 1.0  # 2 prompts a second
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    ingest = ingest_for(config, ledger, pool_with_prompt_7(capacity=1), v.Policies(keep=3), peers, meter, 3)
    try:
        async with trio.open_nursery() as nursery:
            for peer in ("a", "b"):
                nursery.start_soon(ingest.work.reply, peer, "direct", REQUEST)
            await trio.testing.wait_all_tasks_blocked()
            told = [(await ingest.work.reply(f"late{i}", "direct", REQUEST)).retry_after_ms for i in range(4)]
            # 2 waiting, then 0, 1, 2, 3 turned away before: (2 + i) / 2 prompts a second, +-25 %.
            for i, ms in enumerate(told):
                assert 0.75 * (2 + i) / 2 * 1000 <= ms <= 1.25 * (2 + i) / 2 * 1000, (i, told)
            # Once they are due back, only the waiting ones are ahead again.
            await trio.sleep(max(told) / 1000 + 0.01)
            again = (await ingest.work.reply("later", "direct", REQUEST)).retry_after_ms
            assert 0.75 * 1000 <= again <= 1.25 * 1000
            nursery.cancel_scope.cancel()
    finally:
        ledger.close()


async def test_on_a_full_pool_waiting_requests_look_again_only_when_room_is_made(autojump_clock, tmp_path):
    """An answer moves its prompt from the live ones to the buffer and frees
    nothing: the waiting requests are not woken for it. A step that takes
    the buffered group makes room, and a waiting one gets the prompt."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    pool = pool_with_prompt_7(capacity=1)  # NODE holds the one prompt there is room for
    config = LearnerConfig(data_dir=tmp_path, long_poll_s=30, max_waiting_requests=8)
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    ingest = ingest_for(config, ledger, pool, v.Policies(keep=3), peers, CapacityMeter(60.0), 3)
    takes = []
    take = pool.take
    pool.take = lambda peer, n, version: takes.append(peer) or take(peer, n, version)
    answers = {}

    async def ask(peer):
        answers[peer] = await ingest.work.reply(peer, "direct", REQUEST)

    try:
        async with trio.open_nursery() as nursery:
            for peer in ("a", "b", "c"):
                nursery.start_soon(ask, peer)
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(takes) == ["a", "b", "c"] and not answers
            pool.answer(pool.lookup(7), Rollouts(3, NODE.peer_id_str, None))
            await trio.testing.wait_all_tasks_blocked()
            assert len(takes) == 3 and not answers  # nobody looked again
            assert len(await pool.take_batch(1, min_version=0)) == 1  # a step: room for one prompt
            await trio.testing.wait_all_tasks_blocked()
            assert len(takes) == 6  # each looked again once
            (got,) = answers.values()
            assert isinstance(got, WorkAssignment) and len(got.prompts) == 1
            nursery.cancel_scope.cancel()
    finally:
        ledger.close()


async def test_a_learner_at_capacity_turns_new_work_away_and_takes_what_nodes_hold(autojump_clock, tmp_path):
    """When the event loop runs late (--busy-lag-ms), a work request is
    answered 'busy' at once with a time to come back; a batch for prompts a
    node already holds is still judged."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    config = LearnerConfig(data_dir=tmp_path, long_poll_s=10, busy_lag_ms=100)
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    ingest = ingest_for(config, ledger, pool_with_prompt_7(), v.Policies(keep=3), peers, CapacityMeter(60.0), 3)
    try:
        ingest.work.lag.lag_s = 0.3  # three times the bound: as a saturated loop measures it
        reply = await ingest.work.reply("newcomer", "direct", REQUEST)
        assert isinstance(reply, NoWork) and reply.reason.startswith("busy")
        assert trio.current_time() == 0  # at once, not after a long poll
        assert 0.75 * 30_000 <= reply.retry_after_ms <= 1.25 * 30_000  # 10 s x 3, spread
        # A batch is still judged and recorded (a forged one here: no model needed to judge it).
        forged = dataclasses.replace(batch(groups=(GOOD,)), generate_ms=99)
        receipt = await ingest.rollouts.judge(NODE.peer_id_str, forged)
        assert (receipt.verdict, receipt.reason) == ("refused", v.BAD_SIGNATURE)
        assert len(ledger.receipts(NODE.peer_id_str, 0, 10)) == 1
        ingest.work.lag.lag_s = 0.0
        assert isinstance(await ingest.work.reply("newcomer", "direct", REQUEST), WorkAssignment)
    finally:
        ledger.close()


async def test_a_caught_peer_forfeits_its_credit_and_is_refused_from_then_on(autojump_clock, tmp_path):
    """Caught by its evidence: what it earned is forfeited (the ledger's rows
    stay), each batch after is refused for that reason before any recompute,
    and a restarted learner reading the same ledger refuses it too."""
    from echo_learner.ledger import Row
    from echo_learner.verify.evidence import SAMPLER_MISMATCH

    ledger = Ledger(tmp_path / "ledger.sqlite")
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    config = LearnerConfig(data_dir=tmp_path)
    try:
        earned = Row(
            batch_hash=b"h" * 32, peer=NODE.peer_id_str, version=2, nonce=b"e" * 16, rollouts=2, tokens=40,
            verdict="accepted", reason="ok", credit=40.0, created_ms=1, receipt=b"",
        )  # fmt: skip
        ledger.record(earned)
        ingest = ingest_for(config, ledger, pool_with_prompt_7(), v.Policies(keep=3), peers, CapacityMeter(60.0), 3)
        assert ingest.rollouts.verifier.caught(NODE.peer_id_str, SAMPLER_MISMATCH) == SAMPLER_MISMATCH
        receipt = await ingest.rollouts.judge(
            NODE.peer_id_str, batch(groups=(GOOD,))
        )  # no policy held: no recompute ran
        assert (receipt.verdict, receipt.reason, receipt.credit) == ("refused", SAMPLER_MISMATCH, 0.0)
        assert len(peers.peers[NODE.peer_id_str].strikes) == 1
        assert peers.to_json()[0]["caught"] == SAMPLER_MISMATCH
        [standing] = ledger.leaderboard()
        assert (standing.credit, standing.forfeited, standing.accepted) == (0.0, 40.0, 1)
        # Caught once is forfeited once.
        assert ingest.rollouts.verifier.caught(NODE.peer_id_str, SAMPLER_MISMATCH) == SAMPLER_MISMATCH
        assert ledger.leaderboard()[0].forfeited == 40.0
        restarted = ingest_for(config, ledger, pool_with_prompt_7(), v.Policies(keep=3), peers, CapacityMeter(60.0), 3)
        assert restarted.rollouts.verifier.evidence.caught == {NODE.peer_id_str: SAMPLER_MISMATCH}
    finally:
        ledger.close()
