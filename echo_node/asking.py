"""Asking the learner for work: one request and its answer, and the loop that
asks again, pausing longer each time, until the learner assigns some.

Three kinds of "not now" are told apart, each counted on its own: this node
refused what the learner asked for (``Refused``, ``VersionTooLarge``), the
learner refused this node (``WorkRefused``), or the request failed
(``RequestFailed``, ``ProtocolError``: a dropped connection, or a learner
restarting or gone, looked for again where it may have moved). Each waits
``backoff_s`` before the next try.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio
from libp2p.peer.id import ID

from echo_node.config import NodeConfig
from echo_node.refusals import Refused
from protocol.broadcast.following import VersionTooLarge
from protocol.errors import ProtocolError
from protocol.messages import ErrorReply
from protocol.process.logs import event
from protocol.rpc import KeptStreams, RequestFailed
from protocol.wire import work
from protocol.wire.work import NoWork, WorkAssignment, WorkRequest

log = logging.getLogger(__name__)


class WorkRefused(RequestFailed):
    """The learner answered a work request with an error (banned, too many requests)."""


async def ask_once(streams: KeptStreams, learner: ID, ask: WorkRequest, timeout_s: float) -> WorkAssignment | None:
    """The learner's assignment; None when it has no work now (after waiting
    as long as it asked); ``WorkRefused`` when it answers with an error."""
    reply = await streams.request(learner, work.PROTOCOLS, lambda stream: work.ask(stream, ask), timeout_s=timeout_s)
    if isinstance(reply, ErrorReply):
        raise WorkRefused(f"{reply.code}: {reply.message}")
    if isinstance(reply, NoWork):
        if reply.retry_after_ms:
            await trio.sleep(reply.retry_after_ms / 1000)
        return None
    return reply


def backoff_s(tries: int, config: NodeConfig) -> float:
    """The pause before try ``tries + 1``: doubling from retry_s up to max_retry_s."""
    return min(config.retry_s * 2 ** min(tries - 1, 10), config.max_retry_s)


async def keep_asking(
    wants: trio.MemoryReceiveChannel[None],
    assignments: trio.MemorySendChannel[WorkAssignment],
    *,
    ask: Callable[[], Awaitable[WorkAssignment | None]],
    relocate: Callable[[], Awaitable[None]],
    config: NodeConfig,
) -> None:
    """One assignment per request from the generator: ``ask`` until one comes,
    ``relocate`` the learner after each failed request."""
    failures = refused = denied = 0
    async for _ in wants:
        assignment = None
        while assignment is None:
            try:
                assignment = await ask()
            except (Refused, VersionTooLarge) as exc:
                # The learner asked for something this node will not run:
                # say so (the first time, then every 100th) and ask again later.
                refused += 1
                if refused == 1 or refused % 100 == 0:
                    event(log, logging.WARNING, "refused what the learner asked for", reason=exc, times=refused)
                await trio.sleep(backoff_s(refused, config))
                continue
            except WorkRefused as exc:
                # It answers, so it is not lost: it will not give us work
                # (banned, or too many requests), for now.
                denied += 1
                if denied == 1 or denied % 100 == 0:
                    event(log, logging.WARNING, "the learner refuses this node work", reason=exc, times=denied)
                await trio.sleep(backoff_s(denied, config))
                continue
            except (RequestFailed, ProtocolError) as exc:
                failures += 1
                # One failure is often a dropped connection to a learner
                # still there, redialled on the next try (relocate pins its
                # addresses); only the second calls the learner lost.
                if failures == 1:
                    event(log, logging.INFO, "request to the learner failed; retrying", error=exc)
                elif failures == 2:
                    event(log, logging.WARNING, "lost the learner; retrying", error=exc)
                # Exponential backoff for a learner that may be restarting
                # or gone, not synchronisation.
                await trio.sleep(backoff_s(failures, config))
                await relocate()
                continue
            if failures > 1:
                event(log, logging.WARNING, "learner is back", after_failures=failures)
            failures = denied = 0
        await assignments.send(assignment)
