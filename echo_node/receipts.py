"""The learner's signed receipts, as a node checks and keeps them.

Every delivered batch gets a receipt signed by the learner: its verdict, the
tokens credited and the batch's hash. A node checks that the learner signed
it and that it names this node, this job and the batch sent, then appends it
to ``receipts.jsonl`` (rotated past ``receipts_max_mb``: the learner's ledger
keeps every receipt, and ``echo-node credits`` fetches them from there).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from libp2p.peer.id import ID

from protocol import codec
from protocol.errors import SignatureError
from protocol.identity import verify
from protocol.messages import ErrorReply
from protocol.net.swarm import Swarm
from protocol.rpc import RequestFailed, request
from protocol.wire import receipts
from protocol.wire.receipts import ReceiptQuery
from protocol.wire.rollout import Receipt, RolloutBatch
from protocol.wire.work import TOO_MANY_REQUESTS

PAGE_RETRY_S = 1.0  # the learner's page budget refills at --receipt-pages-per-s (1 by default)


def check_origin(receipt: Receipt, learner: str, me: str, job_id: str) -> None:
    """``RequestFailed`` unless ``learner`` signed ``receipt`` for this node and job."""
    try:
        verify(receipt, learner)
    except SignatureError as exc:
        raise RequestFailed(f"receipt not signed by the learner: {exc}") from exc
    if receipt.peer_id != me or receipt.job_id != job_id:
        raise RequestFailed("receipt is for another node or job")


def check_receipt(batch: RolloutBatch, receipt: Receipt, learner: str, me: str, job_id: str) -> None:
    """``RequestFailed`` unless ``receipt`` is the learner's verdict on ``batch``."""
    check_origin(receipt, learner, me, job_id)
    if receipt.batch_hash != codec.digest(batch):
        raise RequestFailed("receipt is for another batch")


async def fetch_all(
    swarm: Swarm, learner: ID, me: str, job_id: str, timeout_s: float, page_size: int = receipts.MAX_PER_PAGE
) -> list[Receipt]:
    """Every receipt the learner holds for this node, page by page, each checked."""
    held: list[Receipt] = []
    after = 0
    while True:
        query = ReceiptQuery(job_id, after, page_size)
        page = await request(
            swarm.host,
            learner,
            receipts.PROTOCOL,
            lambda stream: receipts.ask(stream, query),
            timeout_s=timeout_s,
        )
        if isinstance(page, ErrorReply) and page.code == TOO_MANY_REQUESTS:
            # Past the learner's page budget (a node with more than ~10,000
            # receipts): it refills at about a page a second.
            await trio.sleep(PAGE_RETRY_S)
            continue
        if isinstance(page, ErrorReply):
            raise RequestFailed(f"learner refused the receipts query: {page.code}: {page.message}")
        for receipt in page.receipts:
            check_origin(receipt, learner.to_base58(), me, job_id)
        held.extend(page.receipts)
        if not page.more:
            return held
        after = page.last_id


def save_receipt(path: Path, receipt: Receipt, max_mb: float) -> None:
    """Append ``receipt`` to the node's log; past ``max_mb`` the file becomes
    ``<name>.1`` first (replacing the previous one), so the log stays bounded."""
    line = {
        "batch_hash": receipt.batch_hash.hex(),
        "version": receipt.version,
        "verdict": receipt.verdict,
        "reason": receipt.reason,
        "tokens": receipt.tokens,
        "credit": receipt.credit,
        "receipt": codec.encode(receipt).hex(),
    }
    if path.exists() and path.stat().st_size >= max_mb * 2**20:
        os.replace(path, path.with_name(path.name + ".1"))
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def credit_summary(held: list[Receipt], *, peer: str, job_id: str, learner: str) -> dict[str, Any]:
    """What ``echo-node credits`` reports of the receipts ``fetch_all`` found
    (each signature checked there): the verdicts, the tokens and the credit."""
    accepted = [r for r in held if r.verdict == "accepted"]
    return {
        "peer": peer,
        "job_id": job_id,
        "learner": learner,
        "receipts": len(held),
        "signatures_checked": len(held),
        "accepted": len(accepted),
        "refused": dict(Counter(r.reason for r in held if r.verdict == "refused")),
        "tokens": sum(r.tokens for r in accepted),
        "credit": sum(r.credit for r in accepted),
    }


def print_credit_summary(summary: dict[str, Any]) -> None:
    from protocol.process.tables import print_fields

    refused = ", ".join(f"{k} {v}" for k, v in sorted(summary["refused"].items())) or "none"
    print_fields(
        [
            ("node", summary["peer"]),
            ("job", summary["job_id"]),
            ("receipts", f"{summary['receipts']}, every learner signature valid"),
            ("accepted", f"{summary['accepted']} batches, {summary['tokens']} tokens"),
            ("credit", f"{summary['credit']:.0f}"),
            ("refused", refused),
        ]
    )
