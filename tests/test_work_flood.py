"""A peer that keeps many work requests in flight and never answers cannot
starve honest nodes: beyond two requests at a time it is refused, it holds at
most a newcomer's share of the prompts (and is told to come back later rather
than wait), and each time its prompts expire unanswered
it earns a strike, until it is banned
(real learner and node processes; the flooder is the node's own code in this
test's process, asking over real libp2p)."""

import time

import pytest
import trio

from echo_node.backend_torch import TorchBackend
from echo_node.config import NodeConfig
from echo_node.node import Node
from protocol.identity import load_or_create
from protocol.ids import WORK_PROTOCOL
from protocol.messages import ErrorReply, NoWork, WorkAssignment, WorkRequest
from protocol.rpc import RequestFailed, request
from tests.test_adversaries import LOOPBACK, _wait_for_steps

IN_FLIGHT = 16  # the flooder's concurrent work requests: the whole sync pool
STEPS = 14
TIMEOUT_S = 5  # the learner's assignment timeout: how long an unanswered prompt stays the flooder's


@pytest.mark.timeout(600)
async def test_a_work_flood_gets_a_newcomers_share_and_honest_nodes_keep_training(swarm_factory):
    swarm = swarm_factory
    boot = await trio.to_thread.run_sync(swarm.start_bootstrap)
    learner = swarm.start_learner("--steps", str(STEPS), "--assignment-timeout-s", str(TIMEOUT_S))
    for i in range(2):
        swarm.start_node(i)
    # The honest nodes are proven (a batch accepted) before the flood starts.
    await trio.to_thread.run_sync(lambda: _wait_for_steps(swarm, 2, learner))

    config = NodeConfig(bootstrap=[boot], listen=[LOOPBACK], data_dir=swarm.root / "flooder")
    flooder = Node(config, load_or_create(config.identity_path), TorchBackend(threads=1))
    received: list[tuple[float, float, int, int]] = []  # (got at, deadline, version, prompts), trio clock
    banned: list[str] = []

    async def ask_forever() -> None:
        while True:
            try:
                reply = await request(
                    flooder.swarm.host, flooder.learner, WORK_PROTOCOL,
                    WorkRequest(flooder.job_id, 4, -1, "torch", "f32", "flood", "public"),
                    WorkAssignment, NoWork, ErrorReply, timeout_s=60,
                )
            except RequestFailed:
                return  # the learner finished and left
            if isinstance(reply, ErrorReply) and reply.code == "too_many_requests":
                await trio.sleep(0.1)  # the flooder's own pace: it keeps asking
                continue
            if isinstance(reply, ErrorReply):
                banned.append(reply.code)
                return
            if isinstance(reply, WorkAssignment):
                now = trio.current_time()
                # Never answered: live until it expires or a newer version
                # makes it useless to the learner (sync mode).
                received.append((now, now + TIMEOUT_S, reply.version, len(reply.prompts)))

    async with flooder.joined():
        async with trio.open_nursery() as nursery:
            for _ in range(IN_FLIGHT):
                nursery.start_soon(ask_forever)
            started = time.monotonic()
            # Honest nodes finish the run while the flood goes on.
            await trio.to_thread.run_sync(lambda: _wait_for_steps(swarm, STEPS, learner))
            flooded_s = time.monotonic() - started
            nursery.cancel_scope.cancel()

    assert received, "the flooder never got a prompt: the test proves nothing"
    # At no moment did the flooder hold more live prompts than the newcomers' share (16 x 0.25).
    def live_at(t: float, version: int) -> int:
        return sum(n for got, until, v, n in received if got <= t < until and v == version)

    most = max(live_at(t, v) for t, _, v, _ in received)
    assert most <= 4, received
    # Prompts it left to expire are strikes: it ends up banned.
    assert banned and set(banned) == {"banned"}, banned
    assert flooded_s < 120, flooded_s
    assert await trio.to_thread.run_sync(learner.wait, 60) == 0  # it finishes its steps by itself
    codes = await trio.to_thread.run_sync(swarm.stop_all)
    assert set(codes.values()) == {0}, codes
