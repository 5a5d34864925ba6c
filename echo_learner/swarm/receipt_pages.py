"""The receipts protocol's learner side: a node pages through its own receipts.

A page is up to 500 signed receipts (~170 KiB) read from the ledger, so one
peer asking for pages as fast as it can (the same page again and again)
cost the honest nodes a third of their accepted batches in bench/attacks.py.
Each peer therefore gets a page budget: ``--receipt-pages-burst`` pages at
once, refilled at ``--receipt-pages-per-s``. An honest node asks for its
pages once, at ``echo-node credits`` (20 pages hold 10,000 receipts); a query
past its budget is answered ``too_many_requests`` and every
``REFUSALS_PER_STRIKE``-th such refusal is a strike (``PeerBook``), as for
work requests, so a peer that keeps on is banned, and a banned peer's
queries get ``banned``.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from echo_learner.ledger import Ledger
from echo_learner.swarm.peers import REFUSALS_PER_STRIKE, PeerBook
from protocol import codec
from protocol.messages import UNKNOWN_JOB, ErrorReply
from protocol.wire import work
from protocol.wire.receipts import ReceiptPage, ReceiptQuery
from protocol.wire.rollout import Receipt


class PageBudget:
    """Per peer token buckets, in pages; the least recently used peer's is
    forgotten past ``max_peers`` (a forgotten peer starts with a full one)."""

    def __init__(self, *, per_s: float, burst: int, max_peers: int):
        self.per_s = per_s
        self.burst = burst
        self.max_peers = max_peers
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # peer -> (tokens, at)

    def take(self, peer: str) -> bool:
        """One page for ``peer`` if its budget allows (and spend it)."""
        now = time.monotonic()
        tokens, at = self._buckets.pop(peer, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_s)
        allowed = tokens >= 1.0
        self._buckets[peer] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)
        return allowed


class ReceiptPages:
    def __init__(self, ledger: Ledger, peers: PeerBook, *, job_id: str, budget: PageBudget):
        self.ledger = ledger
        self.peers = peers
        self.job_id = job_id
        self.budget = budget
        self._refusals: OrderedDict[str, int] = OrderedDict()  # over-budget queries per peer (bounded)

    def answer(self, peer: str, query: ReceiptQuery) -> ReceiptPage | ErrorReply:
        """``peer``'s receipts after ``query.after_id``, oldest first."""
        if self.peers.banned(peer):
            return ErrorReply(work.BANNED, "too many strikes; try again later")
        if query.job_id != self.job_id:
            return ErrorReply(UNKNOWN_JOB, f"this learner runs {self.job_id}")
        if not self.budget.take(peer):
            refusals = self._refusals.pop(peer, 0) + 1
            self._refusals[peer] = refusals
            while len(self._refusals) > self.budget.max_peers:
                self._refusals.popitem(last=False)
            if refusals % REFUSALS_PER_STRIKE == 0:
                self.peers.strike(peer)
            return ErrorReply(
                work.TOO_MANY_REQUESTS,
                f"at most {self.budget.burst} pages at once and {self.budget.per_s:g} a second after",
            )
        rows = self.ledger.receipts(peer, query.after_id, query.limit + 1)
        page = rows[: query.limit]
        return ReceiptPage(
            job_id=self.job_id,
            receipts=tuple(codec.decode(r, Receipt) for _, r in page),
            last_id=page[-1][0] if page else query.after_id,
            more=len(rows) > query.limit,
        )
