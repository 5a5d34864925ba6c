"""Connections: a closed one gives its slot back, one address holds a bounded
number, a banned peer is refused both ways until its ban ends, over real
Noise hosts on loopback."""

import time

import pytest
import trio
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import info_from_p2p_addr

from protocol import framing
from protocol.identity import Identity
from protocol.messages import ErrorReply
from protocol.net.conngate import InboundGate, PeerBans, address_key
from protocol.net.host import full_addrs, make_host, parse_multiaddr

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


async def settled(done, timeout_s: float = 5.0) -> None:
    """Until ``done()``: the server side of a refused dial runs on a little
    after the client has given up (both are tasks of this process)."""
    with trio.move_on_after(timeout_s):
        while not done():
            await trio.sleep(0.01)


def serving(message: str, identity: Identity | None = None, **host_options):
    server = make_host(identity or Identity.generate(), [LOOPBACK], **host_options)

    async def handler(stream):
        await framing.send(stream, ErrorReply("hello", message))
        await stream.close()

    server.set_stream_handler("/test/1", handler)
    return server


async def ask(target, identity: Identity | None = None, dials: list | None = None) -> str:
    """A fresh peer connects, reads one answer and hangs up; each dial
    attempt it makes (py-libp2p retries a failed one, and our hosts redial a
    closed connection: protocol.net.host) is appended to ``dials``."""
    client = make_host(identity or Identity.generate(), [])
    if dials is not None:
        network = client.get_network()
        attempt = network._dial_addr_single_attempt

        async def counted(*args, **kwargs):
            dials.append(args[0])
            return await attempt(*args, **kwargs)

        network._dial_addr_single_attempt = counted
    async with client.run([]):
        with trio.fail_after(10):
            await client.connect(target)
            stream = await client.new_stream(target.peer_id, ["/test/1"])
            answer = (await framing.receive(stream, ErrorReply)).message
            await client.disconnect(target.peer_id)
            return answer


async def test_closed_inbound_connections_give_their_slot_back():
    # py-libp2p alone admits 10 inbound connections here (max - min) in the
    # process's whole life; with the gate, 10 at a time.
    small = ConnectionConfig(
        max_connections=14,
        min_connections=4,
        low_watermark=8,
        high_watermark=12,
        max_connections_per_peer=1,
        inbound_upgrade_timeout=3.0,
    )
    server = serving("served", connections=small)
    async with server.run([parse_multiaddr(LOOPBACK)]):
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))
        for i in range(25):
            assert await ask(target) == "served", i


async def test_one_address_holds_at_most_its_share_of_sockets():
    gate = InboundGate(per_ip=4, exempt_loopback=False)
    server = serving("served", gate=gate)
    async with server.run([parse_multiaddr(LOOPBACK)]):
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))
        port = int(target.addrs[0].value_for_protocol("tcp"))
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(4)]
        try:
            # A fifth socket from the same address is closed at once, before
            # any handshake: the server sends nothing.
            with trio.fail_after(5):
                extra = await trio.open_tcp_stream("127.0.0.1", port)
                assert await extra.receive_some(1024) == b""
            assert gate.refused == 1  # that socket, and no other
            with pytest.raises(Exception):
                await ask(target)
            # Sockets that close give their places back.
            for s in idle[:2]:
                await s.aclose()
            with trio.fail_after(5):
                while sum(gate.open.values()) > 2:
                    await trio.sleep(0.01)  # the server notices the close on its next read
            assert await ask(target) == "served"
        finally:
            for s in idle:
                await s.aclose()


def test_addresses_count_per_ipv4_and_per_ipv6_56_and_loopback_is_exempt():
    assert address_key("203.0.113.7") == "203.0.113.7"
    assert address_key("::ffff:203.0.113.7") == "203.0.113.7"
    assert address_key("2001:db8:1:ab00::1") == address_key("2001:db8:1:abff::9") == "2001:db8:1:ab00::/56"
    assert address_key("2001:db8:1:ac00::1") != address_key("2001:db8:1:ab00::1")
    assert address_key("127.0.0.1") is None and address_key("::1") is None
    assert address_key("127.0.0.1", exempt_loopback=False) == "127.0.0.1"
    assert address_key("not an address") is None


async def test_a_banned_peer_is_refused_both_ways_until_its_ban_ends():
    bans = PeerBans(max_peers=16)
    server = serving("served")
    bans.install(server)
    banned, other = Identity.generate(), Identity.generate()
    async with server.run([parse_multiaddr(LOOPBACK)]):
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))
        assert await ask(target, banned) == "served"

        bans.ban(banned.peer_id, time.time() + 60)
        dials: list = []
        with pytest.raises(Exception):
            await ask(target, banned, dials)  # refused once Noise names it: no stream opens
        # Once per dial attempt: py-libp2p retries a refused dial, and its
        # stream redials over the closed connection (protocol.net.host), so
        # 2 or 3 attempts, each refused once (the server may refuse the last
        # just after the client gave up: on a busy machine it came later).
        await settled(lambda: bans.refused == len(dials))
        assert bans.refused == len(dials) >= 2, dials
        refused_inbound = bans.refused
        assert await ask(target, other) == "served"  # nobody else is

        # Outbound too: the server dialling the banned peer keeps no connection.
        listener = serving("served by the banned peer", banned)
        async with listener.run([parse_multiaddr(LOOPBACK)]):
            peer = info_from_p2p_addr(parse_multiaddr(full_addrs(listener)[0]))
            with pytest.raises(Exception), trio.fail_after(10):
                await server.connect(peer)  # py-libp2p retries a failed dial: one refusal each
                await server.new_stream(peer.peer_id, ["/test/1"])
            assert bans.refused > refused_inbound

        bans.ban(banned.peer_id, time.time() - 1)  # the ban has ended
        assert await ask(target, banned) == "served"


def test_bans_are_bounded_oldest_first():
    bans = PeerBans(max_peers=2)
    peers = [Identity.generate().peer_id for _ in range(3)]
    for peer in peers:
        bans.ban(peer, time.time() + 60)
    assert [bans.banned(p) for p in peers] == [False, True, True]


async def test_a_banned_peer_that_redials_costs_no_handshake_while_its_address_cools():
    gate = InboundGate(per_ip=64, exempt_loopback=False, cool_s=60.0)
    server = serving("served", gate=gate)
    bans = PeerBans(max_peers=16)
    bans.install(server, gate)
    banned = Identity.generate()
    bans.ban(banned.peer_id, time.time() + 600)
    async with server.run([parse_multiaddr(LOOPBACK)]):
        target = info_from_p2p_addr(parse_multiaddr(full_addrs(server)[0]))
        dials: list = []
        for _ in range(5):
            with pytest.raises(Exception):
                await ask(target, banned, dials)
        # Its first socket's handshake named it; every later one was closed
        # at accept, before any handshake, its address cooling by then.
        await settled(lambda: gate.cooled == len(dials) - 1)
        assert bans.refused == 1
        assert gate.cooled == len(dials) - 1 >= 5, dials
        assert gate.cooling("127.0.0.1")


async def test_an_address_cools_twice_as_long_while_banned_peers_keep_coming_and_opens_after(autojump_clock):
    gate = InboundGate(per_ip=4, exempt_loopback=False, cool_s=1.0, max_cool_s=4.0, max_cooling=2)
    lengths = []
    for _ in range(4):  # a banned peer refused each time its address opens again
        gate.cool("203.0.113.7")
        started = trio.current_time()
        while gate.cooling("203.0.113.7"):
            await trio.sleep(0.125)
        lengths.append(trio.current_time() - started)
    assert lengths == [1.0, 2.0, 4.0, 4.0]  # doubling, up to max_cool_s
    await trio.sleep(4.0)  # quiet for a cool-down: the next starts short again
    gate.cool("203.0.113.7")
    await trio.sleep(1.0)
    assert not gate.cooling("203.0.113.7")
    assert not gate.cooling("203.0.113.8")  # other addresses were never closed
    local = InboundGate(per_ip=4)
    local.cool("127.0.0.1")
    assert not local.cooling("127.0.0.1")  # loopback is exempt by default: a local swarm is one address
    for ip in ("198.51.100.1", "198.51.100.2", "198.51.100.3"):
        gate.cool(ip)
    assert not gate.cooling("203.0.113.7") and gate.cooling("198.51.100.3")  # bounded: oldest dropped
