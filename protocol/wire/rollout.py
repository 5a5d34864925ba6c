"""The rollout protocol: a node submits a signed batch, the learner answers
with its signed verdict.

A node sends a batch and the learner answers; on version 1.2.0 the node may
send its next batch on the same stream once the receipt is in (a kept
stream, ``protocol.rpc``), on 1.1.0 (served until protocol version 2) a
stream carries one batch. The learner verifies the batch
(``echo_learner.verify.verifier``: the order of checks and every refusal reason),
writes the verdict to its ledger and only then sends the ``Receipt``. A batch
that is oversized or does not decode gets ``ErrorReply("malformed")``
instead: unlike other protocols it is a verdict too (a ledger row, a strike).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

from protocol import codec, framing
from protocol.errors import MessageTooLarge, ProtocolError, StreamClosed
from protocol.framing import ByteStream
from protocol.messages import (
    BACKEND,
    DEVICE_KINDS,
    DTYPES,
    JOB_ID,
    MAX_GROUP,
    MAX_NEW_TOKENS,
    MAX_PROMPTS,
    MAX_U53,
    PEER_ID,
    SHA256,
    SIGNATURE,
    TIME_MS,
    TOKEN,
    VERDICTS,
    VERSION,
    ErrorReply,
    KiB,
    MiB,
)
from protocol.schema import Bytes, Float, Int, ListOf, Nested, Str, check

PROTOCOL = "/echo-swarm/rollout/1.2.0"  # one batch after another on a stream
PROTOCOL_1_1 = "/echo-swarm/rollout/1.1.0"  # one batch per stream
PROTOCOLS = (PROTOCOL, PROTOCOL_1_1)  # what a client proposes, in this order

MALFORMED = "malformed"  # the error code (and ledger reason) of an undecodable batch


@dataclass(frozen=True)
class Completion:
    tokens: tuple[int, ...] = field(metadata=check(ListOf(TOKEN, MAX_NEW_TOKENS)))
    # Log-prob of each sampled token under the node's weights (behaviour policy).
    logprobs: tuple[float, ...] = field(metadata=check(ListOf(Float(-1e4, 0.0), MAX_NEW_TOKENS)))


@dataclass(frozen=True)
class RolloutGroup:
    prompt_id: int = field(metadata=check(Int(0, MAX_U53)))
    completions: tuple[Completion, ...] = field(metadata=check(ListOf(Nested(Completion), MAX_GROUP, 1)))


@dataclass(frozen=True)
class RolloutBatch:
    """Completions for assigned prompts, signed by the node that made them."""

    MAX_BYTES: ClassVar[int] = 8 * MiB

    job_id: str = field(metadata=check(JOB_ID))
    version: int = field(metadata=check(VERSION))
    peer_id: str = field(metadata=check(PEER_ID))
    nonce: bytes = field(metadata=check(Bytes(16, 16)))
    backend: str = field(metadata=check(BACKEND))
    dtype: str = field(metadata=check(Str(16, DTYPES)))
    # Where it was generated: the learner allows for that hardware's rounding
    # (backend, dtype and device together pick the log-prob tolerance).
    device: str = field(metadata=check(Str(16, DEVICE_KINDS)))
    generate_ms: int = field(metadata=check(Int(0, MAX_U53)))
    groups: tuple[RolloutGroup, ...] = field(metadata=check(ListOf(Nested(RolloutGroup), MAX_PROMPTS, 1)))
    signature: bytes = field(metadata=check(SIGNATURE))


@dataclass(frozen=True)
class Receipt:
    """The learner's signed verdict on one rollout batch."""

    MAX_BYTES: ClassVar[int] = 2 * KiB

    job_id: str = field(metadata=check(JOB_ID))
    batch_hash: bytes = field(metadata=check(SHA256))
    peer_id: str = field(metadata=check(PEER_ID))
    version: int = field(metadata=check(VERSION))
    verdict: str = field(metadata=check(Str(16, VERDICTS)))
    reason: str = field(metadata=check(Str(200)))
    tokens: int = field(metadata=check(Int(0, MAX_U53)))
    credit: float = field(metadata=check(Float(0.0, 1e15)))
    created_ms: int = field(metadata=check(TIME_MS))
    learner_id: str = field(metadata=check(PEER_ID))
    signature: bytes = field(metadata=check(SIGNATURE))


async def submit(stream: ByteStream, batch: RolloutBatch) -> Receipt | ErrorReply:
    """The client side: send ``batch``, return the learner's verdict."""
    await framing.send(stream, batch)
    return await framing.receive(stream, Receipt, ErrorReply)


async def answer(
    stream: ByteStream,
    judge: Callable[[RolloutBatch, bytes], Awaitable[Receipt]],
    on_malformed: Callable[[ProtocolError], None],
    on_decoded: Callable[[float], None] = lambda seconds: None,
) -> None:
    """The handler side: read one batch and send ``judge``'s receipt for it
    (``judge`` gets the batch and the frame it came in, to keep as it is).

    A batch that does not decode is reported to ``on_malformed`` and answered
    with ``ErrorReply("malformed")``; a stream cut mid-frame (a sender that
    died) submitted nothing and gets no verdict. An oversized batch is not
    read, so the stream ends after its answer (``MessageTooLarge`` is raised
    again): what follows on it is the rest of that batch, not a frame.
    """
    try:
        data = await framing.read_frame(stream, codec.max_size(RolloutBatch))
        started = time.thread_time()
        batch = codec.decode(data, RolloutBatch)
        on_decoded(time.thread_time() - started)  # its CPU, for the learner's meters
    except StreamClosed:
        raise
    except ProtocolError as exc:
        on_malformed(exc)
        await framing.send(stream, ErrorReply(MALFORMED, str(exc)[:400]))
        if isinstance(exc, MessageTooLarge):
            raise
        return
    await framing.send(stream, await judge(batch, data))
