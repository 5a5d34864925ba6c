"""Circuit relay v2 (``/libp2p/circuit/relay/0.2.0/{hop,stop}``): reaching peers behind NAT.

A node behind NAT can dial out but nobody can dial it. It therefore keeps a
*reservation* on up to two relays (bootstrap peers run one): while it holds
one, a peer can ask the relay to connect it, and the relay splices the two
connections together (end to end the connection is still Noise-encrypted
between the two peers). The node advertises ``<relay addr>/p2p-circuit`` as
one of its addresses, in identify and in its DHT provider records.

- ``RelayLimits`` (``protocol.net.relay_server``, bounded by default): how many
  reservations a relay grants in total, per source range and to peers it does
  not know yet, how many relayed connections each reserved peer may have at
  once, how long and how many bytes each may carry, and how long a
  reservation lasts before it must be renewed. ``RelayServer`` grants them
  only to the connection's own peer, for as long as it stays connected.
- ``RelayClient``: keeps reservations on up to ``max_relays`` relays while it
  is told the node is not publicly reachable, renews each at 80 % of its
  life, tries another relay when one stops answering, and keeps the list of
  relayed addresses the host advertises.

The wire format and both sides of the relay are py-libp2p's
(``libp2p.relay.circuit_v2``), which follow the libp2p spec.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from protocol.net.relay_server import RelayLimits, RelayServer
from protocol.process.logs import event

__all__ = ["RelayClient", "RelayLimits", "Reservation", "relay_protocol"]

log = logging.getLogger(__name__)


def relay_protocol(host: IHost, *, hop: bool, limits: RelayLimits = RelayLimits()) -> CircuitV2Protocol:
    """The relay protocol service: ``hop=True`` relays for others (bootstrap
    peers, ``echo-node join --relay``) within ``limits``, with
    ``protocol.net.relay_server``'s admission; every process accepts relayed
    connections to itself (the stop side). Run it with ``background_trio_service``."""
    return RelayServer(host, limits, allow_hop=hop)


@dataclass
class Reservation:
    relay: str  # peer id
    granted_unix: float
    expires_unix: float
    addrs: list[str]  # our circuit addresses through this relay

    @property
    def renew_unix(self) -> float:
        """When to renew: at 80 % of its life, as the spec recommends."""
        return self.granted_unix + 0.8 * (self.expires_unix - self.granted_unix)


@dataclass
class RelayClient:
    """Holds reservations on up to ``max_relays`` of ``relays`` while ``wanted``;
    when those are not enough, asks ``find_more`` (a DHT lookup) for others."""

    host: IHost
    protocol: CircuitV2Protocol
    relays: list[PeerInfo]
    timeout_s: float
    max_relays: int = 2
    find_more: Callable[[], Awaitable[list[PeerInfo]]] | None = None
    advertised: list[multiaddr.Multiaddr] = field(default_factory=list)  # read by the host's address list
    reservations: dict[str, Reservation] = field(default_factory=dict)
    wanted: bool = False
    _changed: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        config = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT)
        self._transport = CircuitV2Transport(self.host, self.protocol, config)

    def add_relays(self, found: list[PeerInfo], limit: int = 16) -> None:
        """More relays to try (found in the DHT), after the ones we know; at most ``limit`` in all."""
        known = {info.peer_id for info in self.relays} | {self.host.get_id()}
        for info in found:
            if len(self.relays) >= limit:
                return
            if info.peer_id not in known and info.addrs:
                self.relays.append(info)
                known.add(info.peer_id)

    def want(self, wanted: bool) -> None:
        """Hold reservations (the node is not publicly reachable) or drop them."""
        if wanted != self.wanted:
            self.wanted = wanted
            self._changed.set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self._changed = trio.Event()  # before the work: a want() during it wakes us at once
            if not self.wanted:
                self.reservations.clear()
            else:
                await self._keep_reservations()
            self._publish_addrs()
            renew_at = min((r.renew_unix for r in self.reservations.values()), default=time.time() + 30)
            # Wake to renew, to retry missing relays (every 30 s at most), or
            # when told to start or stop.
            with trio.move_on_after(max(1.0, min(renew_at - time.time(), 30.0))):
                await self._changed.wait()

    async def _keep_reservations(self) -> None:
        now = time.time()
        for relay_id, res in list(self.reservations.items()):
            if now >= res.renew_unix:
                del self.reservations[relay_id]  # renewed below, or dropped if it fails
        await self._reserve_on(self.relays)
        if len(self.reservations) < self.max_relays and self.find_more is not None:
            known = len(self.relays)
            self.add_relays(await self.find_more())
            await self._reserve_on(self.relays[known:])

    async def _reserve_on(self, relays: list[PeerInfo]) -> None:
        for info in relays:
            if len(self.reservations) >= self.max_relays:
                return
            relay_id = info.peer_id.to_base58()
            if relay_id in self.reservations or info.peer_id == self.host.get_id():
                continue
            res = await self.reserve(info)
            if res is not None:
                self.reservations[relay_id] = res

    async def reserve(self, info: PeerInfo) -> Reservation | None:
        """Ask relay ``info`` for a reservation (also used by `echo-node doctor`)."""
        relay_id = info.peer_id.to_base58()
        try:
            with trio.fail_after(self.timeout_s):
                await self.host.connect(info)
                stream = await self.host.new_stream(info.peer_id, [HOP_PROTOCOL])
                try:
                    ok = await self._transport._make_reservation(stream, info.peer_id)
                finally:
                    await stream.close()
        except Exception as exc:  # any dial or stream failure: try another relay
            event(log, logging.INFO, "relay did not answer", relay=relay_id, error=exc)
            return None
        if not ok:
            event(log, logging.INFO, "relay refused a reservation", relay=relay_id)
            return None
        expires = float(self._transport._reservations.get(info.peer_id, 0)) or time.time() + 60
        relay_addrs = [str(a) for a in info.addrs if not str(a).startswith("/ip4/127.")] or [str(a) for a in info.addrs]
        addrs = [f"{_without_p2p(a)}/p2p/{relay_id}/p2p-circuit" for a in relay_addrs]
        event(log, logging.WARNING, "holding a relay reservation", relay=relay_id, ttl_s=round(expires - time.time()))
        return Reservation(relay_id, time.time(), expires, addrs)

    async def dial(self, addr: multiaddr.Multiaddr) -> None:
        """Open a relayed connection to ``<relay>/p2p-circuit/p2p/<peer>``."""
        await self._transport.dial(addr)

    def _publish_addrs(self) -> None:
        self.advertised[:] = [multiaddr.Multiaddr(a) for res in self.reservations.values() for a in res.addrs]

    def to_json(self) -> list[dict[str, Any]]:
        now = time.time()
        return [
            {"relay": r.relay, "expires_in_s": round(r.expires_unix - now), "addrs": r.addrs}
            for r in self.reservations.values()
        ]


def _without_p2p(addr: str) -> str:
    return addr.split("/p2p/", 1)[0]
