"""The relay's side of circuit relay v2: who may hold one of its reservations.

py-libp2p's hop service (``CircuitV2Protocol``) reserves for whatever peer id
a RESERVE names, keeps a reservation for its whole lifetime after its holder
has gone, and admits anyone while a slot is free: one connection naming other
peer ids filled a relay in seconds, and a node behind NAT was then refused.
``RelayServer`` keeps py-libp2p's wire format and circuits and changes only who
gets a slot (``ReservationBook``, which does no I/O):

- A reservation is for the peer that Noise authenticated on the connection. A
  RESERVE whose ``peer`` field names anyone else is refused
  (``PERMISSION_DENIED``) and takes nothing. (The spec's RESERVE carries no
  peer; py-libp2p's client names itself, which is accepted.)
- It ends when its holder's last connection to the relay closes (the spec: a
  reservation is valid only while its holder stays connected), or when it
  lapses unrenewed.
- At most ``per_range`` reservations come from one source range (an IPv4 /24,
  an IPv6 /48): one network, however many identities it makes, gets a bounded
  part of the relay.
- Peers the relay does not know hold at most ``1 - known_share`` of the slots;
  the rest stays free for known peers. *Known* is what the relay sees for
  itself: a peer that has been connected to it for ``known_after_s``, now or
  before. Every node connects to its bootstrap peers when it joins (the DHT)
  and asks for a reservation only once AutoNAT found it private, or again
  after a restart or a dropped connection; it then gets in while a crowd of
  fresh identities has filled the strangers' part. Made-up identities cost
  nothing; keeping each one connected for ``known_after_s`` does (and one
  address holds at most ``--connections-per-ip`` sockets), and every one
  still counts against its range. The relay remembers ``known_peers`` of them
  (least recently seen forgotten), in memory: a restarted relay knows only
  the peers connected to it since.

Every refusal is a STATUS on the hop stream; the stream stays open.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits as LibRelayLimits
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg
from multiaddr import Multiaddr

from protocol.process.logs import event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayLimits:
    """What one relay grants. Defaults suit a bootstrap peer on a home uplink
    (docs/limits.md, "The relay")."""

    max_reservations: int = 128  # peers holding a reservation at once
    circuits_per_peer: int = 8  # relayed connections to one reserved peer at once
    circuit_duration_s: int = 600  # a relayed connection is closed after this
    circuit_bytes: int = 64 * 2**20  # ... or after carrying this many bytes
    reservation_ttl_s: int = 900  # a reservation lapses unless renewed
    # Eight: a household or a small office behind one address fits; an
    # attacker needs max_reservations / 8 networks to fill the relay alone.
    per_range: int = 8  # reservations held from one source range at once
    ipv4_prefix: int = 24  # a source range: addresses sharing this IPv4 prefix ...
    ipv6_prefix: int = 48  # ... or this IPv6 one (a site's usual allocation)
    known_share: float = 0.5  # part of the slots strangers cannot take
    known_after_s: float = 600.0  # connected this long, a peer is known
    known_peers: int = 4096  # known peers remembered (least recently seen forgotten)

    def __post_init__(self) -> None:
        checks = {
            "max_reservations": self.max_reservations >= 0,
            "circuits_per_peer": self.circuits_per_peer >= 1,
            "per_range": self.per_range >= 1,
            "ipv4_prefix": 8 <= self.ipv4_prefix <= 32,
            "ipv6_prefix": 16 <= self.ipv6_prefix <= 128,
            "known_share": 0.0 <= self.known_share <= 1.0,
            "known_after_s": self.known_after_s >= 0,
            "known_peers": self.known_peers >= 0,
        }
        bad = [f"{name}={getattr(self, name)!r}" for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"relay limits out of range: {', '.join(bad)}")

    @property
    def strangers_max(self) -> int:
        """Reservations that peers not (yet) known may hold together."""
        return int(self.max_reservations * (1.0 - self.known_share))

    def to_lib(self) -> LibRelayLimits:
        return LibRelayLimits(
            duration=self.circuit_duration_s,
            data=self.circuit_bytes,
            max_circuit_conns=self.circuits_per_peer,
            max_reservations=self.max_reservations,
            reservation_ttl=self.reservation_ttl_s,
        )


def source_range(ip: str | None, limits: RelayLimits) -> str:
    """The range an address counts against: its IPv4 /``ipv4_prefix`` or IPv6
    /``ipv6_prefix`` network. Loopback is not exempt (a local swarm is all one
    range: raise ``per_range`` there). Unknown or unparsable addresses share one."""
    try:
        addr = ipaddress.ip_address(ip or "")
    except ValueError:
        return "unknown"
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    prefix = limits.ipv4_prefix if addr.version == 4 else limits.ipv6_prefix
    return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))


@dataclass
class Holder:
    range: str
    # Granted from the strangers' part: it stays counted there for the
    # reservation's life, or a crowd that ages into "known" would free its
    # part for the next crowd.
    stranger: bool


class Refused(Exception):
    """A RESERVE the book will not grant; ``status`` goes on the wire."""

    def __init__(self, status: StatusCode, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class ReservationBook:
    """Who holds a slot, from which range, and which peers are remembered as
    known: the admission decisions, without I/O."""

    def __init__(self, limits: RelayLimits):
        self.limits = limits
        self.holders: dict[ID, Holder] = {}
        self.per_range: Counter[str] = Counter()
        self.strangers = 0  # holders granted from the strangers' part
        self.known: OrderedDict[ID, None] = OrderedDict()

    def admit(self, peer: ID, source: str, *, known: bool) -> bool:
        """Grant or renew ``peer``'s slot (from ``source``, a range; ``known``:
        remembered, or connected long enough now); True if it is a new one.
        Raises ``Refused`` (and changes nothing) when a limit says no."""
        if peer in self.holders:
            return False
        limits = self.limits
        if len(self.holders) >= limits.max_reservations:
            raise Refused(StatusCode.RESOURCE_LIMIT_EXCEEDED, "every reservation is taken")
        if self.per_range[source] >= limits.per_range:
            raise Refused(StatusCode.RESOURCE_LIMIT_EXCEEDED, "this source range holds its share")
        stranger = not known
        if stranger and self.strangers >= limits.strangers_max:
            raise Refused(StatusCode.RESOURCE_LIMIT_EXCEEDED, "the part for unknown peers is taken")
        self.holders[peer] = Holder(source, stranger)
        self.per_range[source] += 1
        self.strangers += stranger
        return True

    def release(self, peer: ID) -> bool:
        """Free ``peer``'s slot (it left or its reservation lapsed); False if it held none."""
        held = self.holders.pop(peer, None)
        if held is None:
            return False
        self.per_range[held.range] -= 1
        if not self.per_range[held.range]:
            del self.per_range[held.range]
        self.strangers -= held.stranger
        return True

    def remembers(self, peer: ID) -> bool:
        return peer in self.known

    def remember(self, peer: ID) -> None:
        """``peer`` has been connected for ``known_after_s``: known from now on."""
        if self.limits.known_peers == 0:
            return
        self.known[peer] = None
        self.known.move_to_end(peer)
        while len(self.known) > self.limits.known_peers:
            self.known.popitem(last=False)


def _opened_unix(conn: INetConn) -> float:
    """When py-libp2p opened ``conn`` (wall clock; now if it does not say)."""
    return float(getattr(conn, "_created_at", time.time()))


class _Departures(INotifee):
    """Frees a holder's slot when its last connection to the relay closes, and
    remembers a peer whose connection lasted ``known_after_s``."""

    def __init__(self, server: RelayServer):
        self.server = server

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        if time.time() - _opened_unix(conn) >= self.server.book.limits.known_after_s:
            self.server.book.remember(peer)
        if not network.connections.get(peer):  # its other connections keep it
            self.server.release(peer, "disconnected")

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass


class RelayServer(CircuitV2Protocol):
    """py-libp2p's circuit relay v2 service with ``ReservationBook`` admission
    (see the module docstring). Run it with ``background_trio_service``."""

    def __init__(self, host: IHost, limits: RelayLimits, *, allow_hop: bool):
        super().__init__(host, limits=limits.to_lib(), allow_hop=allow_hop)
        self.book = ReservationBook(limits)
        self.refused: Counter[str] = Counter()  # reason -> RESERVEs refused
        if allow_hop:
            host.get_network().register_notifee(_Departures(self))

    async def _handle_reserve(self, stream: INetStream, msg: HopMessage) -> None:
        holder = stream.muxed_conn.peer_id  # authenticated by Noise
        if msg.HasField("peer") and msg.peer.id and msg.peer.id != holder.to_bytes():
            await self._refuse(stream, holder, Refused(StatusCode.PERMISSION_DENIED, "RESERVE names another peer"))
            return
        self._sweep()
        remote = stream.get_remote_address()
        source = source_range(remote[0] if remote else None, self.book.limits)
        try:
            self.book.admit(holder, source, known=self._known(holder))
        except Refused as refusal:
            await self._refuse(stream, holder, refusal)
            return
        # py-libp2p grants what the book admitted: its own count stays within
        # ours, since every slot the book frees is taken out of its table too.
        msg.ClearField("peer")  # so that it reserves for the connection's peer
        await super()._handle_reserve(stream, msg)

    def _known(self, peer: ID) -> bool:
        """Remembered, or connected to us for ``known_after_s`` (then remembered)."""
        if self.book.remembers(peer):
            return True
        conns = self.host.get_network().connections.get(peer) or []
        opened = min((_opened_unix(c) for c in conns), default=time.time())
        if time.time() - opened < self.book.limits.known_after_s:
            return False
        self.book.remember(peer)
        return True

    def release(self, peer: ID, why: str) -> None:
        """Free ``peer``'s slot in the book and in py-libp2p's table."""
        self.resource_manager._reservations.pop(peer, None)
        if self.book.release(peer):
            event(log, logging.DEBUG, "relay reservation freed", peer=peer, why=why)

    def _sweep(self) -> None:
        """Free slots whose reservation lapsed, or whose holder left without
        the relay being told (a missed notification must not keep a slot)."""
        table = self.resource_manager._reservations
        connections = self.host.get_network().connections
        for peer in list(self.book.holders):
            res = table.get(peer)
            # Not in py-libp2p's table: it dropped the reservation as expired,
            # or its handler failed before granting it.
            if res is None or res.is_expired():
                self.release(peer, "lapsed")
            elif not connections.get(peer):
                self.release(peer, "disconnected")

    async def _refuse(self, stream: INetStream, peer: ID, refusal: Refused) -> None:
        self.refused[refusal.reason] += 1
        total = sum(self.refused.values())
        if total == 1 or total % 1000 == 0:  # a crowd must not flood the log
            event(log, logging.WARNING, "relay reservation refused", peer=peer, reason=refusal.reason, refused=total)
        await self._send_status(stream, refusal.status, refusal.reason)


async def reserve_once(stream: INetStream, peer_field: bytes | None = None) -> StatusCode:
    """One RESERVE on an open hop stream, and the relay's answer. ``peer_field``:
    what the message's ``peer`` carries (the spec's client sends none,
    py-libp2p's its own id; a relay must not care). Raises what the stream
    raises, or ``ValueError`` for an answer that is not a status."""
    message = HopMessage(type=HopMessage.RESERVE)
    if peer_field is not None:
        message.peer.CopyFrom(CircuitPeerId(id=peer_field))
    await write_delimited_msg(stream, message)
    answer = await read_delimited_msg(stream, HopMessage)
    if answer.type != HopMessage.STATUS or not answer.HasField("status"):
        raise ValueError(f"relay answered a RESERVE with message type {answer.type}")
    return StatusCode(answer.status)
