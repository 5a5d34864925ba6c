"""Can other peers dial us? AutoNAT v1 (``/libp2p/autonat/1.0.0``), both halves.

A node behind a home router can dial out but nobody can dial it. It learns
which case it is in by asking peers that are reachable themselves (bootstrap
peers, the learner) to dial it back:

- **Server** (``AutoNATServer``): a peer sends the addresses it listens on; we
  dial back each one's port *at the IP we observe the request from* (never any
  other IP, so nobody can aim our dials at a third party), from a separate
  dialer host with a throwaway identity: the asker is already connected to our
  main host, which would reuse that connection instead of dialling. Requests
  that arrive over a relay are refused (their IP is the relay's).
- **Client** (``check_reachability``): asks every server it knows. One
  successful dial-back proves we are public; failed dial-backs and no success
  mean we are behind NAT (or a firewall); no answers leave it unknown.

The wire messages are py-libp2p's protobuf definitions of the libp2p spec, so
rust-libp2p and go-libp2p peers can ask us and answer us.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from protocol.process.logs import event

log = logging.getLogger(__name__)

PUBLIC = "public"
PRIVATE = "private"  # behind NAT or a firewall that refuses inbound dials
UNKNOWN = "unknown"
REACHABILITY = (UNKNOWN, PUBLIC, PRIVATE)
ATTEMPTS = 2  # per server and check, when it gives no answer

# What a server answered, in words (shown by `echo-node status` and doctor).
_ANSWERS = {
    int(Message.OK): "dialled us back",
    int(Message.E_DIAL_ERROR): "could not dial us back",
    int(Message.E_DIAL_REFUSED): "refused to try",
    int(Message.E_BAD_REQUEST): "refused the request",
    int(Message.E_INTERNAL_ERROR): "failed internally",
}


def dialable_addrs(host: IHost) -> list[multiaddr.Multiaddr]:
    """Our listen addresses to offer for a dial-back (the server uses their ports)."""
    out = []
    for addr in host.get_addrs():
        text = str(addr)
        if "/p2p-circuit" in text:
            continue
        if "/p2p/" in text:
            addr = addr.decapsulate(multiaddr.Multiaddr("/p2p/" + text.split("/p2p/", 1)[1]))
        out.append(addr)
    return out


class AutoNATServer(AutoNATService):
    """Answers dial-back requests; dials from ``dialer``, never from ``host``."""

    def __init__(self, host: IHost, dialer: IHost, dial_timeout_s: float):
        super().__init__(host, serve=True)  # type: ignore[arg-type]
        self.dialer = dialer
        self.dial_timeout_s = dial_timeout_s
        self.served = 0

    @staticmethod
    def _filter_by_observed_ip(addrs: list[bytes], observed_ip: str | None) -> list[bytes]:
        """Each advertised TCP port at the observed IP: a NATed peer listens on a
        private address, and the question is whether its router forwards."""
        if observed_ip is None:
            return []
        ip = "ip6" if ":" in observed_ip else "ip4"
        out: list[bytes] = []
        for raw in addrs[:16]:
            try:
                port = multiaddr.Multiaddr(raw).value_for_protocol("tcp")
            except Exception:  # not a TCP address, or not a multiaddr
                continue
            candidate = multiaddr.Multiaddr(f"/{ip}/{observed_ip}/tcp/{port}").to_bytes()
            if candidate not in out:
                out.append(candidate)
        return out

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        self.served += 1
        network = self.dialer.get_network()
        for raw in addrs:
            addr = multiaddr.Multiaddr(raw)
            # A failed dial is cached for 60 s; every request must really dial.
            network.unblock_peer(peer_id)
            try:
                with trio.fail_after(self.dial_timeout_s):
                    await self.dialer.connect(PeerInfo(peer_id, [addr]))
            except Exception as exc:  # any dial failure is the answer "not reachable"
                event(log, logging.DEBUG, "dial-back failed", peer=peer_id, addr=addr, error=exc)
                continue
            finally:
                network.unblock_peer(peer_id)
            with trio.move_on_after(self.dial_timeout_s):
                await self.dialer.disconnect(peer_id)
            return raw
        return None


@dataclass
class Reachability:
    """What the last check found: ``status`` is public, private or unknown."""

    status: str = UNKNOWN
    answers: dict[str, str] = field(default_factory=dict)  # server peer id -> answer in words
    checked_unix: float | None = None
    dialled: list[str] = field(default_factory=list)  # addresses a server reached us at

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "answers": self.answers,
            "checked_unix": self.checked_unix,
            "dialled": self.dialled,
        }

    def describe(self) -> str:
        return {
            PUBLIC: "public (dialable from the internet)",
            PRIVATE: "behind NAT or a firewall",
            UNKNOWN: "unknown (no dial-back answered)",
        }[self.status]


async def check_reachability(host: IHost, servers: Sequence[ID], timeout_s: float) -> Reachability:
    """Ask each server (at the same time) to dial us back; the verdict."""
    client = AutoNATService(host, serve=False)  # type: ignore[arg-type]
    addrs = [a.to_bytes() for a in dialable_addrs(host)]
    result = Reachability()
    statuses: list[int] = []

    async def ask(server: ID) -> None:
        # A busy server's stream can end before it answers; one more try
        # tells a lost answer from a server that cannot answer.
        for attempt in range(ATTEMPTS):
            try:
                status, reached = await client.query_server(server, addrs, timeout=timeout_s)
                break
            except Exception as exc:  # no answer at all: dial, stream or protocol failure
                if attempt == ATTEMPTS - 1:
                    result.answers[server.to_base58()] = f"no answer ({type(exc).__name__})"
                    return
        statuses.append(status)
        if status == int(Message.OK) and reached:
            try:
                text = str(multiaddr.Multiaddr(reached))
            except Exception:  # a malformed address from the server: keep the verdict only
                text = ""
            if text and text not in result.dialled:
                result.dialled.append(text)
        result.answers[server.to_base58()] = _ANSWERS.get(status, f"status {status}")

    if addrs:
        async with trio.open_nursery() as nursery:
            for server in servers:
                if server != host.get_id():
                    nursery.start_soon(ask, server)
    if int(Message.OK) in statuses:
        result.status = PUBLIC
    elif int(Message.E_DIAL_ERROR) in statuses:
        result.status = PRIVATE
    result.checked_unix = time.time()
    return result
