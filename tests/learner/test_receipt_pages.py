"""The receipts protocol's learner side over a real ledger (SQLite): a peer
gets its own receipts page by page, within a page budget; a peer that keeps
asking past it is struck and then banned."""

import pytest

from echo_learner.ledger import Ledger, Row
from echo_learner.swarm.peers import REFUSALS_PER_STRIKE, PeerBook
from echo_learner.swarm.receipt_pages import PageBudget, ReceiptPages
from protocol import codec
from protocol.identity import Identity
from protocol.messages import UNSIGNED, ErrorReply
from protocol.wire.receipts import ReceiptPage, ReceiptQuery
from protocol.wire.rollout import Receipt

LEARNER, NODE, OTHER = Identity.generate(), Identity.generate(), Identity.generate()
JOB = "reverse-test"


def receipt(peer: Identity, n: int) -> bytes:
    signed = LEARNER.sign(
        Receipt(
            job_id=JOB,
            batch_hash=n.to_bytes(32, "big"),
            peer_id=peer.peer_id_str,
            version=1,
            verdict="accepted",
            reason="ok",
            tokens=10,
            credit=10.0,
            created_ms=n,
            learner_id=LEARNER.peer_id_str,
            signature=UNSIGNED,
        )
    )
    return codec.encode(signed)


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for n in range(7):
        for peer in (NODE, OTHER):
            ledger.record(
                Row(
                    batch_hash=n.to_bytes(32, "big"),
                    peer=peer.peer_id_str,
                    version=1,
                    nonce=n.to_bytes(16, "big"),
                    rollouts=2,
                    tokens=10,
                    verdict="accepted",
                    reason="ok",
                    credit=10.0,
                    created_ms=n,
                    receipt=receipt(peer, n),
                )
            )
    return ledger


def pages(ledger: Ledger, *, burst: int) -> tuple[ReceiptPages, PeerBook]:
    peers = PeerBook(strikes_to_ban=3, strike_window_s=600, ban_s=600, max_peers=100)
    # A refill far slower than the test: what is spent stays spent.
    budget = PageBudget(per_s=1e-4, burst=burst, max_peers=100)
    return ReceiptPages(ledger, peers, job_id=JOB, budget=budget), peers


def test_a_peer_pages_through_its_own_receipts_only(ledger):
    receipt_pages, _ = pages(ledger, burst=10)
    got, after = [], 0
    while True:
        page = receipt_pages.answer(NODE.peer_id_str, ReceiptQuery(JOB, after, 3))
        assert isinstance(page, ReceiptPage)
        got.extend(page.receipts)
        after = page.last_id
        if not page.more:
            break
    assert [r.created_ms for r in got] == list(range(7))
    assert {r.peer_id for r in got} == {NODE.peer_id_str}


def test_pages_past_the_budget_are_refused_then_struck_then_banned(ledger):
    receipt_pages, peers = pages(ledger, burst=3)
    query = ReceiptQuery(JOB, 0, 500)
    assert all(isinstance(receipt_pages.answer(NODE.peer_id_str, query), ReceiptPage) for _ in range(3))
    for _ in range(REFUSALS_PER_STRIKE - 1):
        reply = receipt_pages.answer(NODE.peer_id_str, query)
        assert isinstance(reply, ErrorReply) and reply.code == "too_many_requests"
    assert not peers.peers.get(NODE.peer_id_str) or not peers.peers[NODE.peer_id_str].strikes
    receipt_pages.answer(NODE.peer_id_str, query)
    assert len(peers.peers[NODE.peer_id_str].strikes) == 1
    for _ in range(2 * REFUSALS_PER_STRIKE):
        receipt_pages.answer(NODE.peer_id_str, query)
    assert peers.banned(NODE.peer_id_str)
    reply = receipt_pages.answer(NODE.peer_id_str, query)
    assert isinstance(reply, ErrorReply) and reply.code == "banned"
    # Another peer's budget is its own.
    assert isinstance(receipt_pages.answer(OTHER.peer_id_str, query), ReceiptPage)


def test_a_query_for_another_job_gets_unknown_job(ledger):
    receipt_pages, _ = pages(ledger, burst=3)
    reply = receipt_pages.answer(NODE.peer_id_str, ReceiptQuery("another-job", 0, 10))
    assert isinstance(reply, ErrorReply) and reply.code == "unknown_job"
