"""The work protocol: a node asks the learner for prompts to roll out.

A node sends a request and the learner answers; on version 1.5.0 the node
may send its next request on the same stream once the answer is in (a kept
stream, ``protocol.rpc``), on 1.4.0 (served until protocol version 2) a
stream carries one request. The learner may hold the request
open (a long poll) until it has prompts for this node, and answers with a
``WorkAssignment``, a ``NoWork`` when the poll ran out, or an ``ErrorReply``
(``unknown_job``, ``banned``, ``too_many_requests``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

from protocol import framing
from protocol.framing import ByteStream
from protocol.messages import (
    BACKEND,
    DEVICE_KINDS,
    DTYPES,
    JOB_ID,
    MAX_GROUP,
    MAX_NAME,
    MAX_NEW_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_PROMPTS,
    MAX_U53,
    REACHABILITY,
    TIME_MS,
    TOKEN,
    VERSION,
    ErrorReply,
    KiB,
    MiB,
)
from protocol.schema import Float, Int, ListOf, Nested, Str, check

PROTOCOL = "/echo-swarm/work/1.5.0"  # one request after another on a stream
PROTOCOL_1_4 = "/echo-swarm/work/1.4.0"  # one request per stream
PROTOCOLS = (PROTOCOL, PROTOCOL_1_4)  # what a client proposes, in this order

# Error codes of this protocol (besides the shared unknown_job).
BANNED = "banned"  # too many strikes: try again after the ban
TOO_MANY_REQUESTS = "too_many_requests"  # more requests waiting at once than allowed


@dataclass(frozen=True)
class WorkRequest:
    """A node asks the learner for prompts to roll out."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    max_prompts: int = field(metadata=check(Int(1, MAX_PROMPTS)))
    held_version: int = field(metadata=check(Int(-1, MAX_U53)))
    backend: str = field(metadata=check(BACKEND))
    dtype: str = field(metadata=check(Str(16, DTYPES)))
    name: str = field(metadata=check(Str(MAX_NAME)))
    # What the node's AutoNAT check found; the learner shows it on the status
    # page (whether the connection itself is relayed the learner sees itself).
    reachability: str = field(metadata=check(Str(16, REACHABILITY)))
    # What the node runs on, for the peers list and status page; the
    # learner sizes work from the throughput it measures itself.
    device: str = field(metadata=check(Str(16, DEVICE_KINDS)))
    memory_mib: int = field(metadata=check(Int(0, 2**31)))  # free for generation (0: unknown)
    tokens_per_s: float = field(metadata=check(Float(0.0, 1e9)))  # its own measure (0: none yet)


@dataclass(frozen=True)
class Prompt:
    prompt_id: int = field(metadata=check(Int(0, MAX_U53)))
    tokens: tuple[int, ...] = field(metadata=check(ListOf(TOKEN, MAX_PROMPT_TOKENS, 1)))


@dataclass(frozen=True)
class WorkAssignment:
    """Prompts chosen by the learner; the node may not pick its own.

    ``version`` is the learner's newest policy; a node may generate with any
    version from ``min_version`` to ``version`` it already holds (async mode's
    staleness window; in sync mode the two are equal) and fetch the newest
    while it works.
    """

    MAX_BYTES: ClassVar[int] = 1 * MiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    min_version: int = field(metadata=check(VERSION))
    prompts: tuple[Prompt, ...] = field(metadata=check(ListOf(Nested(Prompt), MAX_PROMPTS, 1)))
    group_size: int = field(metadata=check(Int(1, MAX_GROUP)))
    max_new_tokens: int = field(metadata=check(Int(1, MAX_NEW_TOKENS)))
    temperature: float = field(metadata=check(Float(0.0, 10.0)))
    stop_token_ids: tuple[int, ...] = field(metadata=check(ListOf(TOKEN, 16)))
    deadline_ms: int = field(metadata=check(TIME_MS))


@dataclass(frozen=True)
class NoWork:
    """Nothing to hand out right now (e.g. the learner is training); ask again."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    retry_after_ms: int = field(metadata=check(Int(0, 600_000)))
    reason: str = field(metadata=check(Str(200)))


Reply = WorkAssignment | NoWork | ErrorReply


async def ask(stream: ByteStream, request: WorkRequest) -> Reply:
    """The client side: send ``request``, return the learner's answer."""
    await framing.send(stream, request)
    return await framing.receive(stream, WorkAssignment, NoWork, ErrorReply)


async def answer(stream: ByteStream, respond: Callable[[WorkRequest], Awaitable[Reply]]) -> None:
    """The handler side: read one request, send what ``respond`` makes of it."""
    request = await framing.receive(stream, WorkRequest)
    await framing.send(stream, await respond(request))
