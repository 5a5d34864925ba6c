"""The libp2p host every Echo Swarm process runs, with our security settings.

- Noise is the only security transport (py-libp2p's default also accepts
  plaintext and secio; see ../shared/notes/libp2p.md, pitfall 2).
- yamux is the only muxer.
- One connection per peer: otherwise every dial waits a 250 ms happy-eyeballs
  floor (pitfall 1). When a second connection under a peer id arrives,
  py-libp2p closes the older one at once, unless the peer is kept
  (``keep_connection``).
- py-libp2p's resource manager sized to our connection cap: its defaults admit
  256 established inbound connections and 1,000 in all, whatever
  ``ConnectionConfig`` says, so a learner stopped taking nodes at 256
  (bench/swarm_load.py).
- A stream to a peer whose every listed connection is closed dials afresh
  (``dial_past_closed_connections``).
- A peer store sized to the connection cap that never evicts our own entry
  (``OwnPeerStore``).
"""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Callable, Sequence
from typing import Any

import multiaddr
from libp2p import create_yamux_muxer_option, new_host
from libp2p.abc import IHost
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.peer.peerstore import PeerStore
from libp2p.rcmgr import ResourceManager, new_resource_manager
from libp2p.rcmgr.connection_limits import ConnectionLimits
from libp2p.rcmgr.manager import ResourceLimits
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from protocol.identity import Identity
from protocol.net import identify
from protocol.net.conngate import InboundGate
from protocol.net.connlimits import ConnectionSettings


class BadMultiaddr(ValueError):
    """A user-supplied address that is not a usable libp2p multiaddr."""


def parse_multiaddr(text: str) -> multiaddr.Multiaddr:
    try:
        return multiaddr.Multiaddr(text)
    except Exception as exc:  # multiaddr raises several unrelated types
        raise BadMultiaddr(f"not a multiaddr: {text!r} ({exc})") from None


def parse_peer_addr(text: str) -> PeerInfo:
    """A multiaddr that ends in ``/p2p/<peer id>``, as printed by echo-bootstrap."""
    addr = parse_multiaddr(text)
    try:
        return info_from_p2p_addr(addr)
    except Exception:
        raise BadMultiaddr(
            f"{text!r} has no /p2p/<peer id> part; use the full address echo-bootstrap printed"
        ) from None


def check_addrs(listen: Sequence[str], bootstrap: Sequence[str], *, bind: bool = True) -> None:
    """Raise BadMultiaddr for the first unusable address: a CLI calls this
    before it creates anything, so a typo changes nothing on disk. ``bind``:
    ``listen`` are this process's own listen addresses, so also refuse one it
    cannot listen on now (``check_listen``)."""
    for text in listen:
        addr = parse_multiaddr(text)
        if bind:
            check_listen(addr)
    for text in bootstrap:
        parse_peer_addr(text)


def check_listen(addr: multiaddr.Multiaddr) -> None:
    """Raise BadMultiaddr if a TCP listener cannot bind ``addr`` now: its port
    taken, its IP not this machine's. py-libp2p logs such a failure and
    carries on with no listen address, where an operator would see a peer
    nobody can reach (tests/protocol/test_listen.py)."""
    protocols = [p.name for p in addr.protocols()]
    if len(protocols) != 2 or protocols[0] not in ("ip4", "ip6") or protocols[1] != "tcp":
        return  # other transports say for themselves
    check_tcp_listen(addr.value_for_protocol(protocols[0]), int(addr.value_for_protocol("tcp")), str(addr))


def check_tcp_listen(ip: str, port: int, name: str) -> None:
    """Raise BadMultiaddr if a TCP listener cannot bind ``ip``:``port`` now
    (``name``: the address as the operator wrote it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As trio's listeners do: a port in TIME_WAIT is free, one with a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((ip, port))
            probe.listen(1)
        except OSError as exc:
            raise BadMultiaddr(f"cannot listen on {name}: {exc.strerror or exc}") from None


def check_listening(host: IHost, listen: Sequence[multiaddr.Multiaddr]) -> None:
    """After ``host.run(listen)``: raise BadMultiaddr for an address it is not
    listening on (taken since ``check_addrs``, say), with the reason."""
    listening = {str(a) for a in host.get_network().listeners}
    for addr in listen:
        if str(addr) not in listening:
            check_listen(addr)  # names the reason, when it can be found again
            raise BadMultiaddr(f"cannot listen on {addr}")


def connection_config(settings: ConnectionSettings) -> ConnectionConfig:
    """py-libp2p's connection settings for ``settings`` (see its docstring)."""
    return ConnectionConfig(
        max_connections=settings.max_connections,
        high_watermark=settings.max_connections * 15 // 16,  # trimming starts here
        max_connections_per_peer=1,
        inbound_upgrade_timeout=settings.handshake_timeout_s,
    )


def resource_manager(config: ConnectionConfig) -> ResourceManager:
    """py-libp2p's resource manager, admitting what ``config`` admits.

    Handshakes under way are capped at a sixteenth of the connections (py-libp2p's
    64 for 1,024): enough for a crowd of nodes that reconnect at once after a
    restart to get in within a few handshake times, few enough that half-open
    sockets cannot take the whole cap (``InboundGate`` bounds them per address).
    """
    cap = config.max_connections
    return new_resource_manager(
        limits=ResourceLimits(max_connections=cap),
        connection_limits=ConnectionLimits(
            max_pending_inbound=max(64, cap // 16),
            max_pending_outbound=max(64, cap // 16),
            max_established_inbound=cap,
            max_established_outbound=cap,
            max_established_per_peer=8,  # py-libp2p's; ConnectionConfig keeps us at one per peer
            max_established_total=cap,
        ),
    )


# File descriptors the process asks for (each connection takes one).
WANTED_FDS = 4096


def raise_fd_limit() -> None:
    """Lift the soft open-file limit (often 1,024) toward WANTED_FDS, so that the
    connection cap, not the OS, decides who gets in."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = WANTED_FDS if hard == resource.RLIM_INFINITY else min(WANTED_FDS, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def batch_window_updates() -> None:
    """Have yamux credit a stream's reads in batches, as go-yamux does.

    py-libp2p 0.8.1 by default sends a WINDOW_UPDATE frame back for every
    read (``PY_YAMUX_RELEASE_ON_READ``, read at each read): on a kept stream
    carrying small requests that is a third frame, sealed by Noise and sent,
    per exchange. Off, credit goes back once half the window (128 KiB of
    256) has been read. ``python bench/stream_cost.py --json``, its server
    on one core, twice each way, interleaved (2026-11-29): 1.33 and 1.54 ms
    of server CPU per 1 KiB request on a kept stream with it on, 1.06 and
    1.01 off. An operator's own ``PY_YAMUX_RELEASE_ON_READ`` stands.
    """
    os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")


def make_host(
    identity: Identity,
    listen: Sequence[str],
    extra_addrs: Callable[[], list[multiaddr.Multiaddr]] | None = None,
    connections: ConnectionConfig | None = None,
    gate: InboundGate | None = None,
) -> IHost:
    """A host with our security settings. It advertises its listen addresses
    (wildcards expanded) plus what ``extra_addrs()`` returns at the time
    (relayed addresses come and go with reservations, a port mapping's
    public address once a dial-back confirmed it)."""
    raise_fd_limit()
    batch_window_updates()
    key_pair = identity.key_pair
    addrs = [parse_multiaddr(a) for a in listen]
    noise = NoiseTransport(key_pair, noise_privkey=new_x25519_key_pair().private_key)
    connections = connections or connection_config(ConnectionSettings())
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt=create_yamux_muxer_option(),
        connection_config=connections,
        resource_manager=resource_manager(connections),
        peerstore_opt=OwnPeerStore(identity.peer_id, connections.max_connections),
        # Pass the listen addresses here too, or their transport is skipped
        # silently (pitfall 11).
        listen_addrs=addrs,
        # What peers are told (identify, DHT provider records): a wildcard
        # listen address is nobody's address to dial.
        addrs_factory=expand_wildcards,
    )
    (gate or InboundGate(ConnectionSettings().connections_per_ip)).install(host)
    identify.install(host)  # a protocolVersion rust-libp2p peers keep
    dial_past_closed_connections(host)
    if extra_addrs is not None:
        # Not through addrs_factory: py-libp2p cuts each advertised address at
        # its first /p2p/, which would turn a relayed one into the relay's own.
        listen_addrs = host.get_addrs
        me = multiaddr.Multiaddr(f"/p2p/{identity.peer_id_str}")
        host.get_addrs = lambda: [*listen_addrs(), *(a.encapsulate(me) for a in extra_addrs())]  # type: ignore[method-assign]
    return host


class OwnPeerStore(PeerStore):
    """py-libp2p's peer store, holding at least twice our connection cap and
    never evicting our own entry.

    Past ``max_peers`` (1,000 by default) py-libp2p evicts the peers with no
    address first, and our own entry (our keys, no address) is one of them:
    the next DHT put asked the store for our private key, and a learner with
    1,000 volunteers stopped with "peer ID not found" (bench/swarm_load.py
    --levels 1000 --offered 37.5). Each eviction also sorts the whole store.
    """

    def __init__(self, me: ID, max_connections: int):
        super().__init__(max_peers=max(2 * max_connections, PeerStore().max_peers))
        self.me = me

    def _enforce_peer_limit(self) -> None:
        own = self.peer_data_map.pop(self.me, None)
        try:
            super()._enforce_peer_limit()
        finally:
            if own is not None:
                self.peer_data_map[self.me] = own


def dial_past_closed_connections(host: IHost) -> None:
    """Make ``new_stream`` dial when every connection it knows to the peer is closed.

    py-libp2p 0.8 keeps a closed connection listed for at least 100 ms
    (``Yamux.close`` sleeps before the swarm forgets it), and a stream opened
    in that window neither uses it nor dials a new one: "No valid connections
    available". A node whose learner connection closed just then dropped a
    finished batch, and a sync learner waited ~30 s for those prompts
    (5 of 198 bench/attacks.py swarms). Nothing was sent on the closed
    connection, so dialling and opening the stream is safe.
    """
    swarm: Any = host.get_network()
    new_stream = swarm.new_stream

    async def new_stream_dialling(peer_id: ID) -> Any:
        listed = swarm.get_connections(peer_id)
        if listed and all(conn.is_closed for conn in listed):
            await swarm.dial_peer(peer_id)  # skips the closed ones
        return await new_stream(peer_id)

    swarm.new_stream = new_stream_dialling


def _local_ipv4() -> list[str]:
    """This machine's IPv4 addresses, public-looking ones first, loopback last."""
    import ifaddr

    ips = {
        ip.ip
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
        if isinstance(ip.ip, str) and not ip.ip.startswith("169.254.")
    }
    return sorted(ips, key=lambda ip: (ip.startswith("127."), ip))


def expand_wildcards(addrs: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """Each ``/ip4/0.0.0.0/...`` address replaced by one per local interface."""
    out = []
    for addr in addrs:
        text = str(addr)
        if text.startswith("/ip4/0.0.0.0/"):
            out += [parse_multiaddr(text.replace("/ip4/0.0.0.0/", f"/ip4/{ip}/", 1)) for ip in _local_ipv4()]
        else:
            out.append(addr)
    return out


KEPT = "echo-swarm/kept"


def keep_connection(host: IHost, peer: ID) -> None:
    """Never close ``peer``'s connection because a newer one under its id arrived.

    The older one is the one carrying a node's work; the newer one is its
    owner running ``echo-node credits`` beside it, or both sides dialling at
    once. A kept peer holds both until one side closes its own (py-libp2p's
    resource manager still caps connections per peer). Also spared by
    py-libp2p's pruning past the connection cap's high watermark.
    """
    host.get_network().protect(peer, KEPT)


def release_connection(host: IHost, peer: ID) -> None:
    """Undo ``keep_connection`` (a peer forgotten)."""
    host.get_network().unprotect(peer, KEPT)


def any_port(addr: str) -> str:
    """``addr`` with its TCP port left to the system (``tcp/0``): for a command
    run beside a node that holds the configured port."""
    parts = addr.split("/")
    if "tcp" in parts:
        parts[parts.index("tcp") + 1] = "0"
    return "/".join(parts)


def full_addrs(host: IHost) -> list[str]:
    """The addresses this host advertises, each ending in ``/p2p/<peer id>``."""
    return [str(addr) for addr in host.get_addrs()]
