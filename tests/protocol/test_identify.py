"""Our hosts' identify answer: a protocolVersion that a strict rust-libp2p
peer (lattica's Kademlia) keeps, and py-libp2p's everything else (real hosts
on loopback)."""

import trio
from libp2p.identity.identify.identify import parse_identify_response
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import read_varint_prefixed_bytes

from protocol.identity import Identity
from protocol.net import identify
from protocol.net.host import make_host, parse_multiaddr
from protocol.net.swarm import ping

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


async def identify_of(client, server):
    stream = await client.new_stream(server.get_id(), [identify.PROTOCOL])
    try:
        with trio.fail_after(10):
            return parse_identify_response(await read_varint_prefixed_bytes(stream))
    finally:
        await stream.close()


async def test_identify_names_our_protocol_version_and_the_rest_is_py_libp2ps():
    server, client = make_host(Identity.generate(), [LOOPBACK]), make_host(Identity.generate(), [LOOPBACK])
    async with server.run([parse_multiaddr(LOOPBACK)]), client.run([parse_multiaddr(LOOPBACK)]):
        await client.connect(PeerInfo(server.get_id(), server.get_addrs()))
        info = await identify_of(client, server)
    assert info.protocol_version == identify.PROTOCOL_VERSION and info.protocol_version.startswith("/")
    assert info.agent_version.startswith("py-libp2p")
    assert info.public_key == server.get_public_key().serialize()
    assert info.listen_addrs and "/ipfs/ping/1.0.0" in info.protocols


async def test_a_peer_that_requires_our_protocol_version_stays_connected():
    """As lattica does: identify on connect, hang up on any other protocolVersion."""
    server, strict = make_host(Identity.generate(), [LOOPBACK]), make_host(Identity.generate(), [LOOPBACK])
    async with server.run([parse_multiaddr(LOOPBACK)]), strict.run([parse_multiaddr(LOOPBACK)]):
        target = PeerInfo(server.get_id(), server.get_addrs())
        await strict.connect(target)
        if (await identify_of(strict, server)).protocol_version != identify.PROTOCOL_VERSION:
            await strict.disconnect(server.get_id())
        assert strict.get_network().get_connections(server.get_id()), "the strict peer hung up"
        assert await ping(strict, target, 10) < 10
