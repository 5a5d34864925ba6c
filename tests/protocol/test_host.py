"""Our hosts speak Noise only: a plaintext dialer is refused, over real TCP on loopback."""

import time as _time

import pytest
import trio
import trio.testing
from libp2p import create_yamux_muxer_option, new_host
from libp2p.network import swarm as libp2p_swarm
from libp2p.network.config import ConnectionConfig
from libp2p.network.connection import swarm_connection
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport

from protocol import framing
from protocol.identity import Identity
from protocol.messages import ErrorReply
from protocol.net.host import full_addrs, keep_connection, make_host, parse_multiaddr

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def plaintext_host(identity: Identity):
    kp = identity.key_pair
    return new_host(
        key_pair=kp,
        sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(kp)},
        muxer_opt=create_yamux_muxer_option(),
        connection_config=ConnectionConfig(max_connections_per_peer=1),
        listen_addrs=[parse_multiaddr(LOOPBACK)],
    )


def answering_host(message: str, connections=None):
    """A Noise host whose /test/1 handler answers ``message`` and closes."""
    server = make_host(Identity.generate(), [LOOPBACK], connections=connections)

    async def handler(stream):
        await framing.send(stream, ErrorReply("hello", message))
        await stream.close()

    server.set_stream_handler("/test/1", handler)
    return server


async def test_plaintext_dialer_is_refused_and_noise_dialer_accepted():
    server = answering_host("over noise")
    insecure = plaintext_host(Identity.generate())
    secure = make_host(Identity.generate(), [LOOPBACK])
    addr = parse_multiaddr(LOOPBACK)
    async with server.run([addr]), insecure.run([addr]), secure.run([addr]):
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))
        with pytest.raises(Exception):
            with trio.fail_after(20):
                await insecure.connect(target)
                # Even if the TCP dial returned, no stream can be opened.
                await insecure.new_stream(target.peer_id, ["/test/1"])
        assert insecure.get_id() not in server.get_connected_peers()

        with trio.fail_after(20):
            await secure.connect(target)
            stream = await secure.new_stream(target.peer_id, ["/test/1"])
            reply = await framing.receive(stream, ErrorReply)
        assert reply.message == "over noise"


async def test_wildcard_listen_address_is_printed_as_dialable_addresses():
    host = make_host(Identity.generate(), ["/ip4/0.0.0.0/tcp/0"])
    async with host.run([parse_multiaddr("/ip4/0.0.0.0/tcp/0")]):
        addrs = full_addrs(host)
    assert addrs and not any("0.0.0.0" in a for a in addrs)
    assert any(a.startswith("/ip4/127.0.0.1/tcp/") for a in addrs)
    assert all(a.endswith("/p2p/" + host.get_id().to_base58()) for a in addrs)


IDLE_SOCKETS = 300


async def test_an_honest_dial_gets_in_while_hundreds_of_idle_sockets_are_open():
    from protocol.net.connlimits import ConnectionSettings
    from protocol.net.host import connection_config

    # A 3 s handshake deadline, not the default 10 s: the test waits it out.
    server = answering_host("still serving", connection_config(ConnectionSettings(handshake_timeout_s=3.0)))
    honest = make_host(Identity.generate(), [LOOPBACK])
    addr = parse_multiaddr(LOOPBACK)
    async with server.run([addr]), honest.run([addr]):
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))
        port = int(target.addrs[0].value_for_protocol("tcp"))
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(IDLE_SOCKETS)]
        try:
            with trio.fail_after(20):
                await honest.connect(target)
                stream = await honest.new_stream(target.peer_id, ["/test/1"])
                reply = await framing.receive(stream, ErrorReply)
            assert reply.message == "still serving"
            # The idle ones are closed once the handshake deadline has passed.
            with trio.fail_after(8):
                assert await idle[0].receive_some(1024)  # the server's multistream hello
                while await idle[0].receive_some(1024):
                    pass
        finally:
            for s in idle:
                await s.aclose()


@pytest.mark.slow
async def test_a_host_admits_as_many_connections_as_its_cap_says():
    """py-libp2p's resource manager admits 256 established inbound
    connections by default, whatever ``ConnectionConfig`` says: a learner
    stopped taking nodes at 256 (bench/swarm_load.py). Ours follows the cap."""
    from protocol.net.connlimits import ConnectionSettings
    from protocol.net.host import connection_config

    crowd = 270
    server = make_host(
        Identity.generate(), [LOOPBACK], connections=connection_config(ConnectionSettings(max_connections=512))
    )
    connected = 0
    async with server.run(listen_addrs=[parse_multiaddr(LOOPBACK)]):
        info = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))

        async def member(task_status):
            nonlocal connected
            client = make_host(Identity.generate(), [])
            async with client.run(listen_addrs=[]):
                with trio.fail_after(30):
                    await client.connect(info)
                connected += 1
                task_status.started()
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            for _ in range(crowd):
                await nursery.start(member)
            assert connected == crowd
            assert len(server.get_network().connections) == crowd
            nursery.cancel_scope.cancel()


class _Later:
    """The ``time`` module, its clock ``shift_s`` ahead."""

    def __init__(self, shift_s: float):
        self.shift_s = shift_s

    def time(self) -> float:
        return _time.time() + self.shift_s

    def __getattr__(self, name: str):
        return getattr(_time, name)


async def _second_connection_under_one_id(monkeypatch, *, kept: bool) -> bool:
    """A node connects to a learner; half a minute later a second host with
    the node's identity does too. Is the node's first connection still open?"""
    learner = make_host(Identity.generate(), [LOOPBACK])
    node_identity = Identity.generate()
    node, beside = make_host(node_identity, [LOOPBACK]), make_host(node_identity, [LOOPBACK])
    addr = parse_multiaddr(LOOPBACK)
    async with learner.run([addr]), node.run([addr]), beside.run([addr]):
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(learner)[0]))
        with trio.fail_after(20):
            await node.connect(target)
            while not learner.get_network().connections.get(node.get_id()):
                await trio.sleep(0.01)
        first = learner.get_network().connections[node.get_id()][0]
        # Past py-libp2p's 20 s grace period for the first connection, not the second.
        for module in (libp2p_swarm, swarm_connection):
            monkeypatch.setattr(module, "time", _Later(30.0))
        if kept:
            keep_connection(learner, node.get_id())
        with trio.fail_after(20):
            await beside.connect(target)
            while len(learner.get_network().connections.get(node.get_id(), [])) < (2 if kept else 1) or (
                not kept and not first.is_closed
            ):
                await trio.sleep(0.01)
        return not first.is_closed


async def test_py_libp2p_closes_a_peers_older_connection_when_a_second_arrives(monkeypatch):
    """Why the learner keeps its nodes' connections."""
    assert not await _second_connection_under_one_id(monkeypatch, kept=False)


async def test_a_kept_peers_connection_survives_a_second_one_under_its_id(monkeypatch):
    assert await _second_connection_under_one_id(monkeypatch, kept=True)


async def test_a_stream_dials_afresh_while_a_closed_connection_is_still_listed():
    """py-libp2p lists a closing connection for 100 ms more; a node that asked
    its learner then got "No valid connections available" and lost a batch."""
    server = answering_host("after the close")
    client = make_host(Identity.generate(), [LOOPBACK])
    addr = parse_multiaddr(LOOPBACK)
    async with server.run([addr]), client.run([addr]), trio.open_nursery() as nursery:
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))
        with trio.fail_after(20):
            await client.connect(target)
        old = client.get_network().get_connections(target.peer_id)[0]
        nursery.start_soon(old.close)
        await trio.testing.wait_all_tasks_blocked(0.01)
        assert old.is_closed and client.get_network().get_connections(target.peer_id) == [old]
        with trio.fail_after(20):
            stream = await client.new_stream(target.peer_id, ["/test/1"])
            reply = await framing.receive(stream, ErrorReply)
        assert reply.message == "after the close"


def test_a_host_keeps_its_own_keys_when_more_peers_are_known_than_its_store_holds():
    """py-libp2p's peer store evicts peers with no address first once it is
    full, and a host's own entry (its keys, no address) was one: a learner
    with 1,000 volunteers then failed its next DHT put ("peer ID not found")."""
    host = make_host(Identity.generate(), [LOOPBACK])
    store = host.get_peerstore()
    assert store.max_peers >= 2 * host.get_network().connection_config.max_connections
    for i in range(store.max_peers + 10):
        peer = Identity.generate().peer_id
        store.add_addrs(peer, [parse_multiaddr(f"/ip4/127.0.{i // 250}.{i % 250 + 1}/tcp/4001")], 3600)
    assert len(store.peer_ids()) <= store.max_peers + 1
    assert host.get_private_key() is not None  # raised PeerStoreError before
