"""Peers that ask for work and never answer cannot starve honest nodes: one
asking 16 times at once is refused beyond 2 and struck for it until banned;
one keeping 2 requests waiting holds at most the newcomers' share of the
prompts, and each time its prompts expire unanswered it earns a strike, until
it is banned; the flooder's DHT never answering does not hold training steps
either (real learner and node processes; the attackers are the node's own
code in this test's process, asking over real libp2p)."""

import pytest
import trio
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL

from echo_node.backend_torch import TorchBackend
from echo_node.config import NodeConfig
from echo_node.node import Node
from protocol.identity import load_or_create
from protocol.messages import ErrorReply
from protocol.rpc import RequestFailed, request
from protocol.wire import work
from protocol.wire.work import WorkAssignment, WorkRequest
from tests.test_adversaries import LOOPBACK, _wait_for_steps

IN_FLIGHT = 16  # the flooder's concurrent work requests
STEPS = 100_000  # the learner trains until the test stops it
# The step rate while the flood lasts (~20 s: three expiries 5 s apart ban
# the hoarder), against the rate just before it. A DHT put waiting on the
# flooder held each step for 10 s: at most 0.1 steps a second, a tenth or
# less of a healthy learner's here. The attackers' own CPU shares the
# machine's two cores, so a healthy learner may slow to half its rate.
BASELINE_STEPS = 4
MIN_RATE_KEPT = 0.3
TIMEOUT_S = 5  # the learner's assignment timeout: how long an unanswered prompt stays the hoarder's


@pytest.mark.timeout(600)
@pytest.mark.slow
async def test_a_work_flood_gets_a_newcomers_share_and_honest_nodes_keep_training(swarm_factory):
    swarm = swarm_factory
    boot = await trio.to_thread.run_sync(swarm.start_bootstrap)
    learner = swarm.start_learner("--steps", str(STEPS), "--assignment-timeout-s", str(TIMEOUT_S))
    for i in range(2):
        swarm.start_node(i)
    # The honest nodes are proven (a batch accepted) before the flood starts;
    # then the learner's rate with them alone.
    await trio.to_thread.run_sync(lambda: _wait_for_steps(swarm, 2, learner))
    started = trio.current_time()
    await trio.to_thread.run_sync(lambda: _wait_for_steps(swarm, 2 + BASELINE_STEPS, learner))
    rate_before = BASELINE_STEPS / (trio.current_time() - started)

    def flooder(name: str) -> Node:
        config = NodeConfig(bootstrap=[boot], listen=[LOOPBACK], data_dir=swarm.root / name)
        return Node(config, load_or_create(config.identity_path), TorchBackend(threads=1))

    # The hoarder keeps as many requests waiting as the learner allows (2), the
    # flooder 16 at once.
    hoarder, flood = flooder("hoarder"), flooder("flooder")
    received: list[tuple[float, float, int, int]] = []  # hoarder's (got at, deadline, version, prompts)
    codes: dict[str, list[str]] = {"hoarder": [], "flooder": []}
    both_banned = {"hoarder": trio.Event(), "flooder": trio.Event()}

    async def ask_forever(node: Node, name: str) -> None:
        ask = WorkRequest(
            job_id=node.job_id,
            max_prompts=4,
            held_version=-1,
            backend="torch",
            dtype="f32",
            name=name,
            reachability="public",
            device="cpu",
            memory_mib=0,
            tokens_per_s=0.0,
        )
        while True:
            try:
                reply = await request(
                    node.swarm.host, node.learner, work.PROTOCOL, lambda stream: work.ask(stream, ask), timeout_s=60
                )
            except RequestFailed:
                return  # the learner finished and left
            if isinstance(reply, ErrorReply):
                codes[name].append(reply.code)
                if reply.code == "banned":
                    both_banned[name].set()
                    return
                continue  # too_many_requests: it keeps asking
            if isinstance(reply, WorkAssignment) and name == "hoarder":
                now = trio.current_time()
                # Never answered: live until it expires or a newer version
                # makes it useless to the learner (sync mode).
                received.append((now, now + TIMEOUT_S, reply.version, len(reply.prompts)))

    async def never_answer(stream) -> None:
        await trio.sleep_forever()

    try:
        async with hoarder.joined(), flood.joined():
            # The flooder's DHT never answers either. The learner puts each
            # version's manifest to its closest DHT peers; that put held every
            # training step for 10 s while it waited on such a peer.
            flood.swarm.host.set_stream_handler(KAD_PROTOCOL, never_answer)
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(ask_forever, hoarder, "hoarder")
                for _ in range(IN_FLIGHT):
                    nursery.start_soon(ask_forever, flood, "flooder")
                steps_before, flood_started = len(swarm.metrics()), trio.current_time()
                with trio.fail_after(150):
                    for banned in both_banned.values():
                        await banned.wait()
                # Honest nodes kept training meanwhile.
                rate_during = (len(swarm.metrics()) - steps_before) / (trio.current_time() - flood_started)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # py-libp2p's nurseries nest a failure deeper than tracebacks print
        # groups (10 levels): show the innermost error itself.
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from group

    # Asking 16 at once: refused beyond 2, and struck for it until banned.
    assert "too_many_requests" in codes["flooder"] and codes["flooder"][-1] == "banned", codes["flooder"]
    assert received, "the hoarder never got a prompt: the test proves nothing"

    # At no moment did it hold more live prompts than the newcomers' share (16 x 0.25).
    def live_at(t: float, version: int) -> int:
        return sum(n for got, until, v, n in received if got <= t < until and v == version)

    most = max(live_at(t, v) for t, _, v, _ in received)
    assert most <= 4, received
    # Prompts it left to expire are strikes: it ends up banned.
    # (Both of its waiting requests may hear it.)
    assert codes["hoarder"] and set(codes["hoarder"]) == {"banned"}, codes["hoarder"]
    assert rate_during >= MIN_RATE_KEPT * rate_before, (rate_during, rate_before)
    assert learner.poll() is None
    exits = await trio.to_thread.run_sync(swarm.stop_all)
    assert set(exits.values()) == {0}, exits
