"""Joining the swarm: a running host plus a Kademlia DHT connected to bootstrap peers."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.host.ping import ID as PING_PROTOCOL
from libp2p.host.ping import perform_ping_roundtrip
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.network.exceptions import SwarmException
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service

from protocol.identity import Identity
from protocol.ids import DHT_NAMESPACE, RELAY_DIRECTORY_KEY
from protocol.net.conngate import InboundGate
from protocol.net.connlimits import ConnectionSettings
from protocol.net.dht_limits import bound_dht
from protocol.net.dial import HolePuncher, dial
from protocol.net.host import check_listening, connection_config, make_host, parse_multiaddr, parse_peer_addr
from protocol.net.probe import ProbeServer
from protocol.net.reachability import PUBLIC, AutoNATServer, Reachability
from protocol.net.records import ManifestRecordValidator
from protocol.net.relay import RelayClient, RelayLimits, relay_protocol
from protocol.net.upnp import PortMapper, mappable_ports
from protocol.process.logs import event

log = logging.getLogger(__name__)

# How long an AutoNAT server waits for one dial-back: a firewall that drops
# packets would otherwise hold it for the OS's whole TCP connect timeout.
DIAL_BACK_TIMEOUT_S = 5.0
RELAY_TIMEOUT_S = 10.0  # to dial a relay and get a reservation


class BootstrapUnreachable(ConnectionError):
    """None of the bootstrap peers answered."""


@dataclass
class Swarm:
    host: IHost
    dht: KadDHT
    gate: InboundGate | None = None  # admits inbound sockets (PeerBans cools banned peers' addresses there)
    autonat: AutoNATServer | None = None  # set when this process answers dial-back requests
    relay: RelayClient | None = None  # keeps relay reservations while we are not dialable
    puncher: HolePuncher | None = None  # upgrades relayed connections (DCUtR)
    upnp: PortMapper | None = None  # keeps our port forwarded on the LAN's gateway
    # Our public addresses that a dial-back confirmed but that we do not listen
    # on ourselves (a forwarded port on the router's address); advertised.
    public_addrs: list[multiaddr.Multiaddr] = field(default_factory=list)


async def reach(swarm: Swarm, info: PeerInfo, timeout_s: float) -> str:
    """Connect to ``info`` directly, else through a relay and a hole punch
    (``protocol.net.dial``); the route it ended on."""
    relay_dial = swarm.relay.dial if swarm.relay is not None else _no_relay
    return await dial(swarm.host, info, relay_dial=relay_dial, puncher=swarm.puncher, timeout_s=timeout_s)


def advertise_dialled(swarm: Swarm, found: Reachability) -> None:
    """Advertise the addresses a dial-back reached us at that we do not listen
    on ourselves (a port forwarded by the router, by UPnP or by hand); drop
    them once we are no longer public."""
    own = {str(a).split("/p2p/", 1)[0] for a in swarm.host.get_addrs()} - {str(a) for a in swarm.public_addrs}
    wanted = [a for a in found.dialled if a not in own] if found.status == PUBLIC else []
    swarm.public_addrs[:] = [multiaddr.Multiaddr(a) for a in wanted]


async def _no_relay(addr: multiaddr.Multiaddr) -> None:
    raise ConnectionError("this process runs no relay client")


async def connect_bootstrap(swarm: Swarm, bootstrap: Sequence[str], timeout_s: float) -> int:
    """Dial every bootstrap peer and add it to the DHT routing table.

    Returns how many answered; raises ``BootstrapUnreachable`` if none did.
    """
    connected = 0
    for text in bootstrap:
        info = parse_peer_addr(text)
        try:
            with trio.fail_after(timeout_s):
                await swarm.host.connect(info)
        except (trio.TooSlowError, OSError, SwarmException) as exc:
            event(log, logging.WARNING, "bootstrap peer did not answer", addr=text, error=exc)
            continue
        # The DHT does not learn about connected peers by itself (pitfall 6).
        await swarm.dht.add_peer(info.peer_id)
        connected += 1
    if bootstrap and connected == 0:
        raise BootstrapUnreachable(f"no bootstrap peer answered: {', '.join(bootstrap)}")
    return connected


async def ping(host: IHost, info: PeerInfo, timeout_s: float) -> float:
    """One libp2p ping round trip to ``info``, dialling it if no connection is
    held; the round trip in seconds. Raises whatever the dial or the stream
    raised, or ``trio.TooSlowError`` past ``timeout_s``.
    """
    with trio.fail_after(timeout_s):
        await host.connect(info)
        stream = await host.new_stream(info.peer_id, [PING_PROTOCOL])
        try:
            started = time.perf_counter()
            # libp2p's own round trip: it checks the echoed bytes (and rounds
            # to whole milliseconds, hence our own clock).
            await perform_ping_roundtrip(stream)
            return time.perf_counter() - started
        finally:
            await stream.close()


async def announce(swarm: Swarm, key: str, timeout_s: float, count: int = 8) -> int:
    """Become a provider of ``key``: in our own store and on the ``count`` peers of
    our routing table closest to it (where ``find_providers`` looks); how many
    of them took it.

    Not py-libp2p's ``provide``: its network walk waits on every peer in the
    table, and peers behind NAT that cannot be dialled hold it until our
    deadline cancels it before any record was stored.
    """
    dht, host = swarm.dht, swarm.host
    key_bytes = key.encode()
    dht.provider_store.add_provider(key_bytes, PeerInfo(host.get_id(), host.get_addrs()))
    took = 0

    async def tell(peer: ID) -> None:
        nonlocal took
        with trio.move_on_after(timeout_s):
            try:
                took += bool(await dht.provider_store._send_add_provider(peer, key_bytes))
            except (SwarmException, OSError, StreamError) as exc:
                event(log, logging.DEBUG, "provider announcement failed", peer=peer, error=exc)

    async with trio.open_nursery() as nursery:
        for peer in dht.routing_table.find_local_closest_peers(key_bytes, count):
            if peer != host.get_id():
                nursery.start_soon(tell, peer)
    return took


async def find_providers(swarm: Swarm, key: str, timeout_s: float, count: int = 8) -> dict[str, PeerInfo]:
    """Every provider of ``key`` that this peer or its ``count`` closest DHT peers know.

    py-libp2p 0.8.1's ``find_providers`` answers from the local provider store
    alone as soon as it holds anything, and a provider always holds itself, so
    it would never see the others. This asks the closest peers directly too.
    Results are de-duplicated by peer id (the library repeats them).
    """
    dht = swarm.dht
    key_bytes = key.encode()
    found: dict[str, PeerInfo] = {}
    for info in dht.provider_store.get_providers(key_bytes):
        found.setdefault(info.peer_id.to_base58(), info)
    with trio.move_on_after(timeout_s):
        # The routing table's closest peers, not an iterative network walk:
        # that walk queries every peer and, repeated by every process, cost
        # more CPU than the weights themselves in a small swarm.
        closest = dht.routing_table.find_local_closest_peers(key_bytes, count)

        async def ask(peer: ID) -> None:
            with trio.move_on_after(timeout_s):
                try:
                    providers, _ = await dht.provider_store._get_providers_from_peer_with_closers(peer, key_bytes)
                except (SwarmException, OSError, StreamError) as exc:
                    event(log, logging.DEBUG, "provider query failed", peer=peer, error=exc)
                    return
                for info in providers:
                    found.setdefault(info.peer_id.to_base58(), info)

        async with trio.open_nursery() as nursery:
            for peer in closest:
                if peer != swarm.host.get_id():
                    nursery.start_soon(ask, peer)
    return found


async def providers_of(swarm: Swarm, keys: Sequence[str], timeout_s: float) -> dict[str, PeerInfo]:
    """``find_providers`` of each of ``keys`` at once, merged (a key and its
    legacy form: peers of either protocol version)."""
    found: dict[str, PeerInfo] = {}

    async def one(key: str) -> None:
        for peer, info in (await find_providers(swarm, key, timeout_s)).items():
            found.setdefault(peer, info)

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    return found


async def _forward_port(host: IHost, background: trio.Nursery) -> PortMapper:
    """Ask the LAN's gateway to forward our listen port, and keep it forwarded
    while ``background`` runs."""
    mapper = PortMapper(mappable_ports([str(a) for a in host.get_addrs()]))
    await background.start(mapper.run)
    return mapper


async def _answer_probes(host: IHost, stack: AsyncExitStack) -> AutoNATServer:
    """Answer other peers' dial-back requests (from a second, listen-less
    host, run until ``stack`` closes) and their hole-punch and upload probes."""
    dialer = make_host(Identity.generate(), [])
    await stack.enter_async_context(dialer.run([]))
    autonat = AutoNATServer(host, dialer, DIAL_BACK_TIMEOUT_S)
    ProbeServer(host)
    return autonat


@asynccontextmanager
async def open_swarm(
    identity: Identity,
    listen: Sequence[str],
    *,
    server: bool,
    answer_probes: bool = False,
    relay_hop: bool = False,
    relay_limits: RelayLimits = RelayLimits(),
    relays: Sequence[str] = (),
    upnp: bool = False,
    connections: ConnectionSettings = ConnectionSettings(),
) -> AsyncIterator[Swarm]:
    """Run a host and its DHT until the block exits.

    ``server`` selects DHT server mode (bootstrap peers and learners, which
    hold records) or client mode (volunteer nodes, which only query).
    ``answer_probes``: also answer other peers' "can you dial me?" requests
    (``protocol.net.reachability``, from a second, listen-less host) and their
    hole-punch and upload probes (``protocol.net.probe``).
    Every swarm accepts relayed connections to itself and answers hole
    punches over them (``protocol.net.dial``, use ``reach``); ``relay_hop``: also
    relay for others within ``relay_limits``; ``relays``: relays (multiaddrs)
    on which ``swarm.relay`` may hold reservations (run ``swarm.relay.run``).
    ``upnp``: ask the LAN's gateway to forward our listen port (``swarm.upnp``)
    before the block starts, and keep it forwarded until it ends.
    ``connections``: the host's connection limits (operators set them as flags).
    """
    for addr in listen:
        parse_multiaddr(addr)
    relayed_addrs: list[multiaddr.Multiaddr] = []
    public_addrs: list[multiaddr.Multiaddr] = []
    gate = InboundGate(connections.connections_per_ip)
    host = make_host(
        identity,
        listen,
        lambda: [*public_addrs, *relayed_addrs],
        connections=connection_config(connections),
        gate=gate,
    )
    async with AsyncExitStack() as stack:
        listen_addrs = [parse_multiaddr(a) for a in listen]
        await stack.enter_async_context(host.run(listen_addrs))
        check_listening(host, listen_addrs)
        background = await stack.enter_async_context(trio.open_nursery())
        # On exit, stop what runs there (the nursery would otherwise wait for it).
        stack.callback(background.cancel_scope.cancel)
        # strict: records under namespaces nobody registered a validator for
        # are refused, not stored (anyone could otherwise fill our memory).
        dht = KadDHT(host, DHTMode.SERVER if server else DHTMode.CLIENT, strict_validation=True)
        dht.register_validator(DHT_NAMESPACE, ManifestRecordValidator())
        bound_dht(dht)  # and what passes is bounded in size and count
        await stack.enter_async_context(background_trio_service(dht))
        mapper = await _forward_port(host, background) if upnp else None
        circuits = relay_protocol(host, hop=relay_hop, limits=relay_limits)
        await stack.enter_async_context(background_trio_service(circuits))
        puncher = HolePuncher(host)
        await stack.enter_async_context(background_trio_service(puncher))

        async def find_relays() -> list[PeerInfo]:
            return list((await find_providers(swarm, RELAY_DIRECTORY_KEY, RELAY_TIMEOUT_S)).values())

        relay = RelayClient(
            host,
            circuits,
            [parse_peer_addr(a) for a in relays],
            RELAY_TIMEOUT_S,
            find_more=find_relays,
            advertised=relayed_addrs,
        )
        autonat = await _answer_probes(host, stack) if answer_probes else None
        swarm = Swarm(
            host, dht, gate=gate, autonat=autonat, relay=relay, puncher=puncher, upnp=mapper, public_addrs=public_addrs
        )
        yield swarm
