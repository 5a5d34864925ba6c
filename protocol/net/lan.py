"""Finding peers on the local network with mDNS (the libp2p mDNS discovery spec).

Each process announces a ``_p2p._udp.local.`` service whose TXT record holds
``dnsaddr=<multiaddr>/p2p/<peer id>`` for each address it listens on, and
browses for the others. On one LAN a node therefore needs no bootstrap
address at all: it finds the learner (and the other nodes) here, connects,
and adds them to its DHT routing table.

zeroconf runs its own thread; what it finds is handed to trio through the
run's token and a bounded channel (extra announcements are dropped, they
repeat). Nothing found here is trusted more than a DHT entry: Noise checks
the peer id at dial time, and a learner is followed only with its signed
record.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from protocol.net.swarm import Swarm
from protocol.process.logs import event

log = logging.getLogger(__name__)

SERVICE = "_p2p._udp.local."
MAX_FOUND = 256  # announcements waiting for the trio side; more are dropped


def _announced(host: IHost) -> tuple[bytes, list[str], list[bytes], int]:
    """The TXT record (one ``dnsaddr=`` string per address, as the spec
    says), the addresses in it, our IPv4 addresses and a port."""
    addrs = [str(a) for a in host.get_addrs() if not str(a).startswith("/ip4/127.")]
    ips, port = [], 0
    for text in addrs:
        parts = text.split("/")
        if len(parts) > 4 and parts[1] == "ip4" and parts[3] == "tcp":
            ips.append(socket.inet_aton(parts[2]))
            port = port or int(parts[4])
    # Raw TXT: zeroconf's dict form cannot repeat the dnsaddr key.
    strings = [f"dnsaddr={a}".encode()[:255] for a in addrs[:8]]
    txt = b"".join(bytes([len(s)]) + s for s in strings)
    return txt, addrs[:8], ips, port


def _peers_in(txt: bytes) -> list[PeerInfo]:
    """Every ``dnsaddr=`` multiaddr in a raw TXT record, as peer infos."""
    found, i = [], 0
    while i < len(txt):
        size = txt[i]
        string, i = txt[i + 1 : i + 1 + size], i + 1 + size
        if not string.startswith(b"dnsaddr="):
            continue
        try:
            found.append(info_from_p2p_addr(multiaddr.Multiaddr(string[8:].decode())))
        except Exception:  # a malformed announcement from someone on the LAN
            continue
    return found


@asynccontextmanager
async def lan_peers(host: IHost) -> AsyncIterator[trio.MemoryReceiveChannel[PeerInfo]]:
    """Announce ``host`` on the LAN and yield a channel of peers found there."""
    from zeroconf import ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

    token = trio.lowlevel.current_trio_token()
    send, receive = trio.open_memory_channel[PeerInfo](MAX_FOUND)
    me = host.get_id()

    def deliver(info: PeerInfo) -> None:  # on the trio thread
        if info.peer_id != me:
            try:
                send.send_nowait(info)
            except (trio.WouldBlock, trio.ClosedResourceError):
                pass  # it will be announced again

    def on_change(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            return
        info = zeroconf.get_service_info(service_type, name, timeout=2000)  # zeroconf's thread
        for peer in _peers_in(info.text if info is not None and info.text else b""):
            try:
                token.run_sync_soon(deliver, peer)
            except trio.RunFinishedError:
                return

    txt, addrs, ips, port = _announced(host)
    name = f"{secrets.token_hex(16)}.{SERVICE}"
    record = ServiceInfo(
        SERVICE, name, port=port or 4001, properties=txt, addresses=ips, server=f"{name.split('.')[0]}.local."
    )
    zc = await trio.to_thread.run_sync(Zeroconf)
    try:
        await trio.to_thread.run_sync(zc.register_service, record)
        browser = ServiceBrowser(zc, SERVICE, handlers=[on_change])
        event(log, logging.INFO, "announcing on the LAN (mDNS)", addrs=addrs)
        try:
            yield receive
        finally:
            browser.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(zc.close)
        send.close()


async def discover_lan(swarm: Swarm, timeout_s: float, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Announce on the LAN; connect every peer found there and add it to the DHT
    routing table (so DHT lookups reach it), until cancelled."""
    async with lan_peers(swarm.host) as found:
        task_status.started()
        async for info in found:
            if info.peer_id in swarm.host.get_network().connections:
                continue
            try:
                with trio.fail_after(timeout_s):
                    await swarm.host.connect(info)
            except Exception as exc:  # a LAN peer that does not answer is skipped
                event(log, logging.DEBUG, "LAN peer did not answer", peer=info.peer_id, error=exc)
                continue
            await swarm.dht.add_peer(info.peer_id)
            event(log, logging.INFO, "found a peer on the LAN", peer=info.peer_id)
