"""Which connections a host admits, and until when it counts them.

Three things py-libp2p 0.8's swarm does not do:

- **Free a closed connection's inbound slot.** ``Swarm._handle_inbound_connection``
  takes one of ``max_connections - min_connections`` slots and, after the
  upgrade, waits for the *swarm* to stop before it gives the slot back: every
  inbound connection a process ever accepted keeps one. After ~1,000 (with our default
  limits, ``host.ConnectionSettings``), every new inbound connection was refused, whether peers
  churned honestly or someone connected and hung up a thousand times. We run
  its handler in a scope that ends when the connection's socket is closed.
- **Cap connections per address.** At most ``per_ip`` inbound sockets from
  one IPv4 address (one /56 for IPv6, a household's usual allocation), counted
  from accept, before the Noise handshake, to close, as go-libp2p's resource
  manager does. A few households behind one carrier-grade NAT fit; one
  address cannot fill the host. Loopback is exempt: a local swarm is all one
  address.
- **Refuse a banned peer** (``PeerBans``), inbound or outbound, as soon as
  the Noise handshake has named it and before it can open a stream, as
  go-libp2p's connection gater does. py-libp2p has only a negative cache
  for its own failed dials. A peer refused by a learner's every handler
  still costs it a stream negotiation and a task per request; closed out,
  it costs a handshake per dial.
- **Cool an address that sends banned peers.** A banned peer that redials
  as fast as it can made 97,806 attempts in 30 s (issue 55), each a Noise
  handshake before the refusal. Each inbound refusal of a banned peer closes
  its address (as ``address_key`` counts it) to new sockets, before any
  handshake, for ``cool_s``, doubling while refusals go on (up to
  ``max_cool_s``): a few handshakes a minute instead. An honest peer behind
  the same address waits out the cool-down like the per-address cap.
  Loopback is exempt here too.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.io.abc import ReadWriteCloser
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID

from protocol.process.logs import event

log = logging.getLogger(__name__)

IPV6_PREFIX = 56


def address_key(ip: str, exempt_loopback: bool = True) -> str | None:
    """What ``ip`` counts against: itself, its /56, or None (loopback, unparsable)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback and exempt_loopback:
        return None
    if addr.version == 6:
        return str(ipaddress.ip_network(f"{addr}/{IPV6_PREFIX}", strict=False))
    return str(addr)


class _Watched(ReadWriteCloser):
    """A socket stream that calls ``on_close`` once it has been closed."""

    def __init__(self, inner: ReadWriteCloser, on_close: Callable[[], None]):
        self._inner = inner
        self._on_close = on_close

    async def read(self, n: int | None = None) -> bytes:
        return await self._inner.read(n)

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    async def close(self) -> None:
        try:
            await self._inner.close()
        finally:
            self._on_close()  # after the close, which it may cancel if called from the handler

    def get_remote_address(self) -> tuple[str, int] | None:
        return self._inner.get_remote_address()

    def __getattr__(self, name: str) -> Any:  # anything else the transport offers
        return getattr(self._inner, name)


class InboundGate:
    """Admits inbound sockets to ``host``'s swarm; see the module docstring.
    ``max_cooling``: addresses cooled at once (the oldest is dropped past it)."""

    def __init__(
        self,
        per_ip: int,
        exempt_loopback: bool = True,
        *,
        cool_s: float = 1.0,
        max_cool_s: float = 60.0,
        max_cooling: int = 4096,
    ):
        self.per_ip = per_ip
        self.exempt_loopback = exempt_loopback
        self.open: Counter[str] = Counter()  # address key -> sockets open now
        self.refused = 0
        self.cool_s, self.max_cool_s, self.max_cooling = cool_s, max_cool_s, max_cooling
        # address key -> (closed until, length of its last cool-down), oldest first
        self._cooling: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.cooled = 0  # sockets closed because their address was cooling

    def cool(self, ip: str) -> None:
        """A banned peer came from ``ip``: close its address for a while, twice
        as long as last time if that ended less than a cool-down ago."""
        key = address_key(ip, self.exempt_loopback)
        if key is None:
            return
        now = trio.current_time()
        until, length = self._cooling.pop(key, (-math.inf, 0.0))
        length = min(self.max_cool_s, 2 * length) if now < until + length else self.cool_s
        self._cooling[key] = (now + length, length)
        while len(self._cooling) > self.max_cooling:
            self._cooling.popitem(last=False)

    def cooling(self, ip: str) -> bool:
        """Are new sockets from ``ip``'s address closed now?"""
        key = address_key(ip, self.exempt_loopback)
        return key is not None and self._is_cooling(key)

    def _is_cooling(self, key: str) -> bool:
        cooling = self._cooling.get(key)
        return cooling is not None and trio.current_time() < cooling[0]

    def install(self, host: IHost) -> None:
        swarm: Any = host.get_network()
        upgrade = swarm._handle_inbound_connection  # looked up per connection by the listener

        async def admit(stream: ReadWriteCloser, maddr: Any) -> None:
            remote = stream.get_remote_address()
            key = address_key(remote[0], self.exempt_loopback) if remote else None
            if key is not None and self._is_cooling(key):
                self.cooled += 1  # no log line: there may be thousands a second
                await stream.close()
                return
            if key is not None and self.open[key] >= self.per_ip:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    event(
                        log,
                        logging.WARNING,
                        "refusing inbound connections beyond the per-address cap",
                        address=key,
                        cap=self.per_ip,
                        refused=self.refused,
                    )
                await stream.close()
                return
            if key is not None:
                self.open[key] += 1
            # A cancel scope, not a task: this runs for every socket accepted,
            # and most sockets on a busy public node never finish a handshake.
            # Those close their socket from this task and return by themselves;
            # cancelling them too would make py-libp2p unwind its clean-up
            # through Cancelled (a third of the cost of an idle socket).
            handler = trio.lowlevel.current_task()
            scope = trio.CancelScope()

            def on_close() -> None:
                if trio.lowlevel.current_task() is not handler:
                    scope.cancel()  # an established connection, closed by its muxer

            try:
                with scope:
                    await upgrade(_Watched(stream, on_close), maddr)  # ends when the socket closes
            finally:
                if key is not None:
                    self.open[key] -= 1
                    if not self.open[key]:
                        del self.open[key]

        swarm._handle_inbound_connection = admit


class PeerBans:
    """Peers whose connections a host closes as soon as Noise names them, each
    until a time. Bounded: past ``max_peers`` the oldest ban is dropped."""

    def __init__(self, max_peers: int):
        self.max_peers = max_peers
        self._until: OrderedDict[ID, float] = OrderedDict()  # oldest ban first
        self.refused = 0

    def ban(self, peer: ID, until: float) -> None:
        self._until.pop(peer, None)
        self._until[peer] = until
        while len(self._until) > self.max_peers:
            self._until.popitem(last=False)

    def banned(self, peer: ID) -> bool:
        until = self._until.get(peer)
        if until is not None and until <= time.time():
            del self._until[peer]
            until = None
        return until is not None

    def install(self, host: IHost, gate: InboundGate | None = None) -> None:
        """Refuse banned peers' connections on ``host``; the addresses of
        inbound ones cool at ``gate`` (the host's ``InboundGate``)."""
        swarm: Any = host.get_network()
        add_conn = swarm.add_conn  # every connection passes here once secured and muxed

        async def admit(muxed_conn: Any, direction: str = "unknown") -> Any:
            peer = muxed_conn.peer_id
            if self.banned(peer):
                self.refused += 1
                event(log, logging.DEBUG, "refused a banned peer's connection", peer=peer, direction=direction)
                remote = muxed_conn.get_remote_address() if direction == "inbound" else None
                if gate is not None and remote:
                    gate.cool(remote[0])
                try:
                    await muxed_conn.close()
                except Exception:
                    pass  # it may have hung up already
                raise SwarmException(f"{peer} is banned")
            return await add_conn(muxed_conn, direction)

        swarm.add_conn = admit
