"""The receipts protocol: a node pages through its own receipts.

One query and one page per stream. The learner answers only with receipts of
the peer on the other end of the connection, oldest first; the node asks
again from ``last_id`` while ``more`` is true and checks each receipt's
signature itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

from protocol import framing
from protocol.framing import ByteStream
from protocol.messages import JOB_ID, MAX_U53, ErrorReply, KiB
from protocol.schema import Bool, Int, ListOf, Nested, check
from protocol.wire.rollout import Receipt

PROTOCOL = "/echo-swarm/receipts/1.0.0"
MAX_PER_PAGE = 500


@dataclass(frozen=True)
class ReceiptQuery:
    """A node asks the learner for its own receipts (the learner answers only
    with receipts of the peer on the other end of the connection)."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    after_id: int = field(metadata=check(Int(0, MAX_U53)))
    limit: int = field(metadata=check(Int(1, MAX_PER_PAGE)))


@dataclass(frozen=True)
class ReceiptPage:
    """Receipts with ledger ids above the query's ``after_id``, oldest first;
    ask again from ``last_id`` while ``more`` is true."""

    MAX_BYTES: ClassVar[int] = MAX_PER_PAGE * Receipt.MAX_BYTES

    job_id: str = field(metadata=check(JOB_ID))
    receipts: tuple[Receipt, ...] = field(metadata=check(ListOf(Nested(Receipt), MAX_PER_PAGE)))
    last_id: int = field(metadata=check(Int(0, MAX_U53)))
    more: bool = field(metadata=check(Bool()))


async def ask(stream: ByteStream, query: ReceiptQuery) -> ReceiptPage | ErrorReply:
    """The client side: send ``query``, return the page."""
    await framing.send(stream, query)
    return await framing.receive(stream, ReceiptPage, ErrorReply)


async def answer(stream: ByteStream, respond: Callable[[ReceiptQuery], Awaitable[ReceiptPage | ErrorReply]]) -> None:
    """The handler side: read one query, send what ``respond`` makes of it."""
    query = await framing.receive(stream, ReceiptQuery)
    await framing.send(stream, await respond(query))
