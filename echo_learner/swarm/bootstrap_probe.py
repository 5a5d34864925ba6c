"""Whether the bootstrap peers answer: a libp2p ping to each, every few seconds.

A held connection says little (a hung or firewalled peer can keep its socket
open for minutes); a ping round trip says its host is serving. A ping also
redials a peer whose connection dropped, so a restarted bootstrap peer is
found again and goes back into the DHT's routing table. The status page and
``/metrics`` show the result.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.peer.peerinfo import PeerInfo

from protocol.net.host import parse_peer_addr
from protocol.net.swarm import Swarm, ping
from protocol.process.logs import event

log = logging.getLogger(__name__)


@dataclass
class BootstrapHealth:
    addr: str
    info: PeerInfo  # the parsed addr
    answers: bool | None = None  # None: not asked yet
    rtt_ms: float | None = None  # of the last answer
    checked_unix: float | None = None
    last_answer_unix: float | None = None
    error: str = ""  # why the last ping failed

    def to_json(self, now: float, connected: bool) -> dict[str, Any]:
        def ago(t: float | None) -> float | None:
            return None if t is None else round(now - t, 1)

        return {
            "addr": self.addr,
            "answers": self.answers,
            "rtt_ms": self.rtt_ms,
            "checked_s_ago": ago(self.checked_unix),
            "last_answer_s_ago": ago(self.last_answer_unix),
            "error": self.error,
            "connected": connected,  # whether we hold a connection to it now
        }


class BootstrapProbe:
    def __init__(self, swarm: Swarm, addrs: list[str], interval_s: float, timeout_s: float):
        self.swarm = swarm
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.peers = [BootstrapHealth(addr, parse_peer_addr(addr)) for addr in addrs]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Ping every peer, then wait ``interval_s``, until cancelled."""
        task_status.started()
        while True:
            await self.check()
            await trio.sleep(self.interval_s)

    async def check(self) -> None:
        """Ping every peer once, all at the same time."""
        async with trio.open_nursery() as nursery:
            for peer in self.peers:
                nursery.start_soon(self._probe, peer)

    async def _probe(self, peer: BootstrapHealth) -> None:
        was, info = peer.answers, peer.info
        # py-libp2p refuses to redial a peer for 60 s after a failed dial; a
        # probe must really ask each time, or it reports that cache instead.
        self.swarm.host.get_network().unblock_peer(info.peer_id)
        try:
            rtt_s = await ping(self.swarm.host, info, self.timeout_s)
        # Any failure of the dial or the stream means the same thing here: no
        # answer. (Cancellation is a BaseException and still goes through.)
        except Exception as exc:
            peer.answers = False
            if isinstance(exc, trio.TooSlowError):
                peer.error = f"no answer within {self.timeout_s:g} s"
            else:
                peer.error = f"{type(exc).__name__}: {exc}"[:200]
            if was is not False:
                event(log, logging.WARNING, "bootstrap peer does not answer", addr=peer.addr, error=peer.error)
            # A connection that cannot carry a ping is dead weight, and while
            # it is held py-libp2p would not dial a restarted peer afresh.
            with trio.move_on_after(self.timeout_s):
                await self.swarm.host.disconnect(info.peer_id)
        else:
            peer.answers, peer.error, peer.rtt_ms = True, "", round(rtt_s * 1000, 2)
            peer.last_answer_unix = time.time()
            if was is False:
                event(log, logging.WARNING, "bootstrap peer answers again", addr=peer.addr)
                await self.swarm.dht.add_peer(info.peer_id)
        peer.checked_unix = time.time()

    def to_json(self) -> list[dict[str, Any]]:
        now = time.time()
        connections = self.swarm.host.get_network().connections
        return [peer.to_json(now, peer.info.peer_id in connections) for peer in self.peers]
