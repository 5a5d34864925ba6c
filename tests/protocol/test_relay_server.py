"""Who gets a relay reservation: real py-libp2p hosts over 127.0.0.1, a real
relay (``RelayServer``) and RESERVE messages as a stranger would send them."""

from contextlib import asynccontextmanager

import pytest
import trio
from libp2p.abc import INotifee
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.tools.anyio_service import background_trio_service

from protocol.identity import Identity
from protocol.net.host import full_addrs, make_host, parse_multiaddr
from protocol.net.relay import RelayLimits, relay_protocol
from protocol.net.relay_server import ReservationBook, reserve_once, source_range

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
OK = StatusCode.OK
FULL = StatusCode.RESOURCE_LIMIT_EXCEEDED


@asynccontextmanager
async def relay(limits: RelayLimits):
    """A relay on loopback: yields (its PeerInfo, its host)."""
    host = make_host(Identity.generate(), [LOOPBACK])
    async with host.run([parse_multiaddr(LOOPBACK)]):
        async with background_trio_service(relay_protocol(host, hop=True, limits=limits)):
            yield info_from_p2p_addr(parse_multiaddr(full_addrs(host)[0])), host


@asynccontextmanager
async def peer(target, identity: Identity | None = None):
    """A peer connected to ``target`` (as ``identity``, or a fresh one): yields
    an open hop stream. Leaving the block closes its connection."""
    host = make_host(identity or Identity.generate(), [])
    async with host.run([]):
        with trio.fail_after(10):
            await host.connect(target)
            stream = await host.new_stream(target.peer_id, [HOP_PROTOCOL])
        try:
            yield stream
        finally:
            # What a process that exits does to its sockets (leaving host.run
            # alone leaves the connection open).
            await host.disconnect(target.peer_id)


async def reserve(stream, peer_field: bytes | None = None) -> StatusCode:
    with trio.fail_after(10):
        return await reserve_once(stream, peer_field)


class Departures(INotifee):
    """Sets ``gone`` once ``peer`` has no connection left to the host."""

    def __init__(self, peer):
        self.peer, self.gone = peer, trio.Event()

    async def disconnected(self, network, conn) -> None:
        if conn.muxed_conn.peer_id == self.peer and not network.connections.get(self.peer):
            self.gone.set()

    async def opened_stream(self, network, stream) -> None: ...
    async def closed_stream(self, network, stream) -> None: ...
    async def connected(self, network, conn) -> None: ...
    async def listen(self, network, multiaddr) -> None: ...
    async def listen_close(self, network, multiaddr) -> None: ...


def watch_departure(host, identity: Identity) -> trio.Event:
    watcher = Departures(identity.peer_id)
    host.get_network().register_notifee(watcher)
    return watcher.gone


async def test_reserve_naming_other_peers_takes_no_slot():
    limits = RelayLimits(max_reservations=2, per_range=100, known_share=0)
    async with relay(limits) as (target, _):
        trick = make_host(Identity.generate(), [])
        async with trick.run([]):
            await trick.connect(target)
            answers = []
            for _ in range(6):  # a stream each: py-libp2p's relay ends one after a failure
                stream = await trick.new_stream(target.peer_id, [HOP_PROTOCOL])
                answers.append(await reserve(stream, Identity.generate().peer_id.to_bytes()))
            # Both slots are still free for peers reserving for themselves.
            async with peer(target) as a, peer(target) as b:
                assert [await reserve(a), await reserve(b)] == [OK, OK]
            assert answers == [StatusCode.PERMISSION_DENIED] * 6


async def test_a_peer_naming_itself_or_nobody_gets_a_slot_and_renews_it():
    limits = RelayLimits(max_reservations=1, per_range=100, known_share=0)
    me = Identity.generate()
    async with relay(limits) as (target, _):
        async with peer(target, me) as stream:
            assert await reserve(stream, me.peer_id.to_bytes()) == OK
            assert await reserve(stream) == OK  # a renewal: no second slot
            async with peer(target) as other:
                assert await reserve(other) == FULL


async def test_a_holder_that_disconnects_frees_its_slot():
    limits = RelayLimits(max_reservations=1, per_range=100, known_share=0)
    holder = Identity.generate()
    async with relay(limits) as (target, relay_host):
        gone = watch_departure(relay_host, holder)
        async with peer(target) as waiting:
            async with peer(target, holder) as stream:
                assert await reserve(stream) == OK
                assert await reserve(waiting) == FULL
            with trio.fail_after(10):
                await gone.wait()  # the relay saw the connection close
            assert await reserve(waiting) == OK


async def test_one_source_range_holds_at_most_its_share():
    limits = RelayLimits(max_reservations=8, per_range=2, known_share=0)
    async with relay(limits) as (target, _):
        async with peer(target) as a, peer(target) as b, peer(target) as c:
            assert [await reserve(a), await reserve(b), await reserve(c)] == [OK, OK, FULL]
            async with peer(target) as d:
                assert await reserve(d) == FULL  # refused ones took nothing either
            assert await reserve(c) == FULL


async def test_a_known_peer_gets_in_after_a_crowd_of_strangers():
    # The honest peer has been connected for known_after_s (a node joins its
    # bootstrap peers first, and asks for a reservation once AutoNAT finds it
    # private); then a crowd of fresh identities reserves, staying connected,
    # and tries the other-peer trick as well.
    limits = RelayLimits(max_reservations=4, per_range=100, known_share=0.5, known_after_s=1.0)
    async with relay(limits) as (target, _):
        async with peer(target) as honest:
            await trio.sleep(limits.known_after_s)  # the duration is what makes it known
            answers, answered = trio.open_memory_channel[StatusCode](6)

            async def join() -> None:  # stays connected (holding what it got) until cancelled
                async with peer(target) as stream:
                    got = await reserve(stream)
                    await reserve(stream, Identity.generate().peer_id.to_bytes())
                    await answers.send(got)
                    await trio.sleep_forever()

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(join)
                with trio.fail_after(30):
                    crowd = [await answered.receive() for _ in range(6)]
                assert crowd.count(OK) == 2  # the strangers' part
                assert await reserve(honest) == OK
                async with peer(target) as newcomer:
                    assert await reserve(newcomer) == FULL  # a slot is free, but not for strangers
                nursery.cancel_scope.cancel()


async def test_a_known_peer_is_remembered_after_it_leaves():
    limits = RelayLimits(max_reservations=2, per_range=100, known_share=0.5, known_after_s=0.5)
    me = Identity.generate()
    async with relay(limits) as (target, relay_host):
        gone = watch_departure(relay_host, me)
        async with peer(target, me):
            await trio.sleep(limits.known_after_s)
        with trio.fail_after(10):
            await gone.wait()
        async with peer(target) as stranger, peer(target, me) as back:
            assert await reserve(stranger) == OK
            assert await reserve(back) == OK  # fresh connection, but known


def test_the_book_refuses_without_changing_anything():
    book = ReservationBook(RelayLimits(max_reservations=3, per_range=2, known_share=0.5))
    a, b, c = (Identity.generate().peer_id for _ in range(3))
    assert book.admit(a, "r1", known=False)
    with pytest.raises(Exception, match="unknown peers"):
        book.admit(b, "r2", known=False)
    assert book.admit(b, "r1", known=True)
    with pytest.raises(Exception, match="source range"):
        book.admit(c, "r1", known=True)
    assert (len(book.holders), dict(book.per_range), book.strangers) == (2, {"r1": 2}, 1)
    assert book.release(a) and not book.release(a)
    assert (dict(book.per_range), book.strangers) == ({"r1": 1}, 0)


def test_source_ranges():
    limits = RelayLimits()
    assert source_range("203.0.113.7", limits) == source_range("203.0.113.200", limits) == "203.0.113.0/24"
    assert source_range("203.0.114.7", limits) != source_range("203.0.113.7", limits)
    assert source_range("::ffff:203.0.113.9", limits) == "203.0.113.0/24"
    assert source_range("2001:db8:1:2::1", limits) == source_range("2001:db8:1:ff::1", limits) == "2001:db8:1::/48"
    assert source_range(None, limits) == source_range("junk", limits) == "unknown"


def test_limits_out_of_range_are_refused():
    with pytest.raises(ValueError, match="known_share"):
        RelayLimits(known_share=1.5)
    with pytest.raises(ValueError, match="per_range"):
        RelayLimits(per_range=0)
