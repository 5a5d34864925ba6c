"""The learner's bootstrap probe against a real bootstrap process that stops and restarts."""

import socket

import trio

from echo_learner.swarm.bootstrap_probe import BootstrapProbe
from protocol.identity import Identity
from protocol.net.swarm import open_swarm


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_bootstrap_peer_that_stops_and_restarts_is_reported_and_found_again(swarm_factory):
    # A restarted bootstrap keeps its key and port, so its address is the same.
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    addr = await trio.to_thread.run_sync(lambda: swarm_factory.start_bootstrap(listen=listen))
    async with open_swarm(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"], server=True) as learner:
        probe = BootstrapProbe(learner, [addr], interval_s=1, timeout_s=5)
        (health,) = probe.peers
        await probe.check()
        assert health.answers is True and health.rtt_ms > 0 and health.error == "", health.error

        assert await trio.to_thread.run_sync(swarm_factory.stop, "bootstrap") == 0
        await probe.check()
        assert health.answers is False and health.error and health.last_answer_unix is not None

        # Back on the same address: found at once (not after py-libp2p's 60 s
        # dial back-off) and put back into the DHT's routing table.
        boot_id = learner.dht.routing_table.get_peer_ids()
        for peer in boot_id:
            learner.dht.routing_table.remove_peer(peer)
        assert await trio.to_thread.run_sync(lambda: swarm_factory.start_bootstrap(listen=listen)) == addr
        await probe.check()
        assert health.answers is True, health.error
        assert [p.to_base58() for p in learner.dht.routing_table.get_peer_ids()] == [addr.rsplit("/", 1)[-1]]
        (shown,) = probe.to_json()
        assert shown["addr"] == addr and shown["answers"] is True and 0 <= shown["last_answer_s_ago"] < 5
