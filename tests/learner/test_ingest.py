"""The learner's rollout handler: a refused batch's prompts go to another node at once."""

import dataclasses

import trio

from echo_learner import verify as v
from echo_learner.capacity import CapacityMeter
from echo_learner.config import LearnerConfig
from echo_learner.ingest import Ingest
from echo_learner.ledger import Ledger
from echo_learner.peers import PeerBook
from echo_learner.tasks.reverse import ReverseTask
from tests.learner.test_verify import GOOD, LIMITS, pool_with_prompt_7
from tests.protocol.samples import LEARNER, NODE, batch


async def test_a_refused_batch_gives_its_prompts_to_the_next_node_at_once(autojump_clock, tmp_path):
    pool = pool_with_prompt_7()  # prompt 7 held by NODE, for 30 s
    ledger = Ledger(tmp_path / "ledger.sqlite")
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    ingest = Ingest(
        LearnerConfig(data_dir=tmp_path),
        LEARNER,
        job_id=LIMITS.job_id,
        task=ReverseTask(),
        decode=lambda ids: bytes(ids).decode(errors="replace"),
        pad_id=256,
        limits=LIMITS,
        pool=pool,
        policies=v.Policies(keep=3),
        ledger=ledger,
        peers=peers,
        meter=CapacityMeter(60.0),
        current_version=lambda: 3,
    )
    try:
        forged = dataclasses.replace(batch(groups=(GOOD,)), generate_ms=99)  # signature no longer fits
        receipt = await ingest._judge(NODE.peer_id_str, forged)
        assert (receipt.verdict, receipt.reason) == ("refused", v.BAD_SIGNATURE)
        # Not 30 s later: now, to the next node that asks.
        assert [a.prompt_id for a in pool.take("honest", 1, version=3)] == [7]
        # The refused node has no claim on them left: another batch for them is a strike too.
        again = await ingest._judge(NODE.peer_id_str, batch(groups=(GOOD,)))
        assert (again.verdict, again.reason) == ("refused", v.NOT_ASSIGNED)
        await trio.sleep(31)
        pool.take("third", 1, version=3)  # lapses are charged when prompts are handed out
        assert len(peers.peers[NODE.peer_id_str].strikes) == 2  # the two refusals' strikes, no lapse on top
    finally:
        ledger.close()
