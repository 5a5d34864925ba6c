"""Reaching a peer the best way the NATs between us allow.

``dial`` tries, in order:

1. the peer's direct addresses, for ``direct_timeout_s`` when it also
   advertises relayed ones (a NATed peer's private addresses usually drop our
   packets silently, so a long wait there only delays the relay);
2. each relayed address (``<relay>/p2p-circuit/p2p/<peer>``): the relay
   splices our connection to the peer's reservation;
3. over that relayed connection, a DCUtR hole punch (``/libp2p/dcutr``): both
   sides dial each other's predicted public address at the same moment, which
   MASQUERADE-style routers let through. On success the relayed leg is closed,
   so every stream opened afterwards (chunks, have-streams) runs direct; where
   the routers do not allow it (random port mapping) the relayed connection
   stays, within the relay's limits.

The DCUtR wire protocol and both sides of it are py-libp2p's; ``HolePuncher``
only turns off its background "punch every relayed connection every 2 s" loop
(the dialler punches once, as part of its dial, before it opens any stream)
and its second try of the direct addresses.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol

from protocol.process.logs import event
from protocol.rpc import route

log = logging.getLogger(__name__)

DIRECT_TIMEOUT_S = 3.0  # for the direct addresses of a peer that also has relayed ones
PUNCH_TIMEOUT_S = 6.0  # one DCUtR round; a successful one takes well under a second
MAX_REMEMBERED = 256  # peers whose last punch outcome is kept (for status and benchmarks)


class DialFailed(ConnectionError):
    """No address of the peer answered."""


class HolePuncher(DCUtRProtocol):
    """py-libp2p's DCUtR, driven by ``dial`` only; remembers how each punch ended."""

    def __init__(self, host: IHost):
        super().__init__(host, read_timeout=int(PUNCH_TIMEOUT_S), dial_timeout=int(PUNCH_TIMEOUT_S))
        self.outcomes: dict[str, bool] = {}  # peer -> did its last punch end direct

    async def _auto_drive_loop(self) -> None:
        await trio.sleep_forever()

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        # ``dial`` has just tried the direct addresses; trying them again would
        # spend the whole punch budget on the ones that drop packets.
        return False

    async def punch(self, peer: ID, timeout_s: float = PUNCH_TIMEOUT_S) -> bool:
        """Try once to replace the relayed connection to ``peer`` by a direct one."""
        ok = False
        with trio.move_on_after(timeout_s):
            ok = await self.initiate_hole_punch(peer)
        self.outcomes.pop(peer.to_base58(), None)
        self.outcomes[peer.to_base58()] = ok
        if len(self.outcomes) > MAX_REMEMBERED:
            del self.outcomes[next(iter(self.outcomes))]
        if ok:
            await _close_relayed(self.host, peer)
        event(log, logging.INFO, "hole punch", peer=peer, direct=ok)
        return ok


def connections(host: IHost, peer: ID) -> list[Any]:
    conns = host.get_network().connections.get(peer) or []
    return conns if isinstance(conns, list) else [conns]


def current_route(host: IHost, peer: ID) -> str | None:
    """How we are connected to ``peer`` now (``direct`` preferred), or None."""
    routes = [route(conn) for conn in connections(host, peer)]
    if not routes:
        return None
    return "direct" if "direct" in routes else routes[0]


async def _close_relayed(host: IHost, peer: ID) -> None:
    for conn in connections(host, peer):
        if route(conn) != "direct":
            await conn.close()


def is_relayed(addr: multiaddr.Multiaddr) -> bool:
    return "/p2p-circuit" in str(addr)


async def dial(
    host: IHost,
    info: PeerInfo,
    *,
    relay_dial: Callable[[multiaddr.Multiaddr], Awaitable[None]],
    puncher: HolePuncher | None,
    timeout_s: float,
    direct_timeout_s: float = DIRECT_TIMEOUT_S,
) -> str:
    """Connect to ``info`` (direct, else relayed and then hole-punched); the route.

    ``relay_dial(addr)`` opens a relayed connection (``RelayClient.dial``).
    Raises ``DialFailed`` when no address worked within ``timeout_s`` in all.
    """
    peer = info.peer_id
    known = current_route(host, peer)
    if known is not None:
        return known
    direct = [a for a in info.addrs if not is_relayed(a)]
    relayed = [a for a in info.addrs if is_relayed(a)]
    errors: list[str] = []
    with trio.move_on_after(timeout_s):
        if direct:
            direct_s = direct_timeout_s if relayed else timeout_s
            with trio.move_on_after(direct_s) as scope:
                try:
                    await host.connect(PeerInfo(peer, direct))
                    return "direct"
                except Exception as exc:  # py-libp2p's dial errors share no base class
                    errors.append(f"direct: {exc}")
            if scope.cancelled_caught:
                errors.append(f"direct: no answer in {direct_s:g} s")
        for addr in relayed:
            try:
                await relay_dial(_with_peer(addr, peer))
                break
            except Exception as exc:
                errors.append(f"{addr}: {exc}")
        else:
            raise DialFailed(f"could not reach {peer}: {'; '.join(errors) or 'no addresses'}")
    route_now = current_route(host, peer)
    if route_now is None:
        raise DialFailed(f"could not reach {peer} in {timeout_s:g} s: {'; '.join(errors)}")
    if route_now != "direct" and puncher is not None and await puncher.punch(peer):
        return "direct"
    return route_now


def _with_peer(addr: multiaddr.Multiaddr, peer: ID) -> multiaddr.Multiaddr:
    """``addr`` ending in ``/p2p/<peer>`` (provider records may carry it or not)."""
    if str(addr).endswith(f"/p2p/{peer.to_base58()}"):
        return addr
    return addr.encapsulate(multiaddr.Multiaddr(f"/p2p/{peer.to_base58()}"))
