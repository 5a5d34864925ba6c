"""UPnP-IGD port mapping: asking the home router to forward our listen port.

Many home routers run a UPnP Internet Gateway Device. When one answers, the
node asks it to forward the TCP port it listens on (the same port outside),
renews the lease at half its life and deletes the mapping when it stops.
Peers can then dial the node directly: the AutoNAT dial-back
(``protocol.net.reachability``) confirms it and the node advertises the address
that worked. A router without UPnP (or with it turned off) costs one short
discovery at start. ``--no-upnp`` turns it off.

miniupnpc (the reference client, in C) does the SSDP discovery and the SOAP
calls; they block, so they run in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol.process.logs import event

log = logging.getLogger(__name__)

DISCOVER_MS = 2000  # how long SSDP waits for a gateway to answer
LEASE_S = 3600  # asked for; renewed at half of it
DESCRIPTION = "echo-swarm node"


@dataclass
class PortMapper:
    """Keeps ``ports`` (TCP) forwarded on the LAN's gateway while ``run`` runs."""

    ports: Sequence[int]
    lease_s: int = LEASE_S
    discover_ms: int = DISCOVER_MS
    state: str = "not tried"  # in words, for status and doctor
    external_ip: str = ""  # what the gateway says its WAN address is (may be private: double NAT)
    mapped: list[int] = field(default_factory=list)
    _gateway: Any = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Map the ports, report started (after the first try), renew until cancelled; then unmap."""
        if not self.ports:
            self.state = "nothing to map (listening on loopback only)"
            task_status.started()
            return
        try:
            await trio.to_thread.run_sync(self._map_all, abandon_on_cancel=True)
            task_status.started()
            while self._gateway is not None:
                await trio.sleep(self.lease_s / 2)
                await trio.to_thread.run_sync(self._map_all, abandon_on_cancel=True)
        finally:
            if self.mapped:
                with trio.move_on_after(3) as scope:
                    scope.shield = True  # we are being cancelled: still say goodbye to the router
                    await trio.to_thread.run_sync(self._unmap_all, abandon_on_cancel=True)

    def _map_all(self) -> None:
        import miniupnpc

        if self._gateway is None:
            gateway = miniupnpc.UPnP()
            gateway.discoverdelay = self.discover_ms
            try:
                # miniupnpc raises a bare Exception (with texts such as
                # "Success") when no device answers or none is a gateway.
                found = gateway.discover()
                gateway.selectigd()
            except Exception:
                found = 0
            if not found:
                self.state = "no UPnP gateway answered on the LAN"
                return
            try:
                self.external_ip = gateway.externalipaddress() or ""
            except Exception as exc:
                self.state = f"the UPnP gateway did not answer ({exc})"
                return
            self._gateway = gateway
        mapped = []
        for port in self.ports:
            try:
                self._gateway.addportmapping(port, "TCP", self._gateway.lanaddr, port, DESCRIPTION, "", self.lease_s)
                mapped.append(port)
            except Exception as exc:
                self.state = f"the gateway refused to forward TCP port {port} ({exc})"
                event(log, logging.INFO, "UPnP mapping refused", port=port, error=exc)
        self.mapped = mapped
        if mapped:
            self.state = f"TCP port {', '.join(map(str, mapped))} forwarded (external address {self.external_ip})"
            event(log, logging.INFO, "UPnP port mapped", ports=mapped, external_ip=self.external_ip)

    def _unmap_all(self) -> None:
        for port in self.mapped:
            try:
                self._gateway.deleteportmapping(port, "TCP")
            except Exception as exc:
                event(log, logging.DEBUG, "UPnP unmapping failed", port=port, error=exc)
        self.mapped = []

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "mapped_ports": self.mapped, "external_ip": self.external_ip}


def mappable_ports(addrs: Sequence[str]) -> list[int]:
    """The TCP ports of our listen addresses that a LAN gateway could forward to."""
    ports = set()
    for addr in addrs:
        parts = addr.split("/")
        if "/p2p-circuit" in addr:
            continue  # a relayed address: its port is the relay's
        if len(parts) > 4 and parts[1] == "ip4" and parts[3] == "tcp" and not parts[2].startswith("127."):
            ports.add(int(parts[4]))
    return sorted(ports)
