"""Little internets made of Linux network namespaces, for NAT tests and benchmarks.

    with Topology("es1") as net:
        net.public("boot", "10.77.0.2")          # a machine on the public segment
        home = net.home("h1", "10.77.0.11")        # a home router doing MASQUERADE NAT
        net.host_in(home, "n1")                    # a machine behind it
        strict = net.home("h2", "10.77.0.12", strict=True)
        proc = net.popen("n1", ["python", ...])

The public segment is a bridge in its own namespace (10.77.0.0/24). A home
router has its WAN leg on that bridge and a LAN of its own (192.168.<k>.0/24);
its machines route through it. Routers behave like consumer ones:

- ``home``: MASQUERADE (source ports kept where free) and unsolicited inbound
  packets dropped silently, which is what lets a TCP hole punch through;
- ``strict=True``: MASQUERADE ``--random-fully`` (every mapping gets a random
  port, so a peer cannot predict it) and every unsolicited inbound packet
  dropped: hole punching must fail there, only a relay can carry traffic;
- ``upnp=True``: also runs miniupnpd (a real UPnP-IGD daemon, Debian's
  ``miniupnpd-iptables``) that forwards ports on request from its LAN.

Everything is created under names starting with the topology's prefix and
removed on exit (deleting a namespace deletes its interfaces). Needs root and
the ``ip``, ``iptables`` and ``tc`` commands (``miniupnpd`` for UPnP homes); ``missing_tools()`` says what is
absent. Only the topology's own addresses are ever used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PUBLIC_NET = "10.77.0"
UPNP_PLACEHOLDER_IP = "44.0.0.1"  # see Topology._run_upnp


def missing_tools(*extra: str) -> str:
    """Why these topologies (with the ``extra`` commands) cannot be built here ('' when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, iptables)"
    absent = [tool for tool in ("ip", "iptables", "tc", *extra) if shutil.which(tool) is None]
    if absent:
        return f"needs the commands {', '.join(absent)} (Debian: iproute2, iptables, miniupnpd-iptables)"
    return ""


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class Machine:
    name: str
    ns: str
    ip: str


@dataclass
class Home:
    name: str
    ns: str
    wan_ip: str
    lan: str  # e.g. "192.168.1" (a /24)
    strict: bool
    hosts: int = 0
    upnp: bool = False


@dataclass
class Topology:
    prefix: str
    machines: dict[str, Machine] = field(default_factory=dict)
    homes: dict[str, Home] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)
    _daemons: list[tuple[subprocess.Popen, Path]] = field(default_factory=list)  # and its config dir

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def __enter__(self) -> Topology:
        self.close()  # leftovers of a killed run with the same prefix
        self._ns(self.hub)
        self._in(self.hub, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.hub, "ip", "link", "set", "br0", "up")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for daemon, config_dir in self._daemons:
            daemon.terminate()
            daemon.wait()
            shutil.rmtree(config_dir, ignore_errors=True)
        self._daemons.clear()
        existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in existing.splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(self.prefix + "-"):
                # A killed run leaves its processes inside (miniupnpd among
                # them: an orphan one made a later run's UPnP home unreachable).
                pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._namespaces.clear()

    # --- building -----------------------------------------------------------

    def _ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        self._in(ns, "ip", "link", "set", "lo", "up")

    def _in(self, ns: str, *argv: str) -> None:
        sh("ip", "netns", "exec", ns, *argv)

    def _wire_to_hub(self, ns: str, dev: str, ip: str) -> None:
        """A veth from ``ns`` (named ``dev`` there) into the public bridge."""
        outer = f"{self.prefix[:6]}{len(self._namespaces)}h"
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", dev, "netns", ns)
        sh("ip", "link", "set", outer, "netns", self.hub)
        self._in(self.hub, "ip", "link", "set", outer, "master", "br0")
        self._in(self.hub, "ip", "link", "set", outer, "up")
        self._in(ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
        self._in(ns, "ip", "link", "set", dev, "up")

    def public(self, name: str, ip: str) -> Machine:
        """A machine with an address on the public segment."""
        ns = f"{self.prefix}-{name}"
        self._ns(ns)
        self._wire_to_hub(ns, "eth0", ip)
        machine = self.machines[name] = Machine(name, ns, ip)
        return machine

    def home(self, name: str, wan_ip: str, *, strict: bool = False, upnp: bool = False) -> Home:
        """A home router: WAN on the public segment, its own LAN, NAT between."""
        ns = f"{self.prefix}-{name}"
        self._ns(ns)
        self._wire_to_hub(ns, "wan", wan_ip)
        lan = f"192.168.{len(self.homes) + 1}"
        self._in(ns, "ip", "link", "add", "lan", "type", "bridge")
        self._in(ns, "ip", "addr", "add", f"{lan}.1/24", "dev", "lan")
        self._in(ns, "ip", "link", "set", "lan", "up")
        self._in(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        nat = ["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"]
        self._in(ns, *nat, *(["--random-fully"] if strict else []))
        # Unsolicited packets from the internet are dropped without an answer,
        # as consumer routers do; replies to what the LAN sent pass.
        for chain in ("INPUT", "FORWARD"):
            self._in(
                ns, "iptables", "-A", chain, "-i", "wan", "-m", "conntrack", "--ctstate", "NEW,INVALID", "-j", "DROP"
            )
        home = self.homes[name] = Home(name, ns, wan_ip, lan, strict, upnp=upnp)
        if upnp:
            self._run_upnp(home)
        return home

    def _run_upnp(self, home: Home) -> None:
        """miniupnpd on ``home``'s router, forwarding ports its LAN asks for."""
        # miniupnpd-iptables writes its rules with the legacy iptables
        # interface into chains it expects to exist; port forwards must pass
        # the router's "drop unsolicited packets" rule.
        for argv in (
            ["iptables-legacy", "-t", "nat", "-N", "MINIUPNPD"],
            ["iptables-legacy", "-t", "nat", "-A", "PREROUTING", "-i", "wan", "-j", "MINIUPNPD"],
            ["iptables-legacy", "-t", "nat", "-N", "MINIUPNPD-POSTROUTING"],
            ["iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MINIUPNPD-POSTROUTING"],
            ["iptables-legacy", "-N", "MINIUPNPD"],
            ["iptables-legacy", "-A", "FORWARD", "-i", "wan", "-j", "MINIUPNPD"],
            ["iptables", "-I", "FORWARD", "1", "-i", "wan", "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"],
        ):
            self._in(home.ns, *argv)
        conf = Path(tempfile.mkdtemp(prefix=f"{home.ns}-")) / "miniupnpd.conf"
        # miniupnpd refuses to forward when its WAN address is private (it
        # assumes carrier-grade NAT beyond), and ours are: ext_ip declares a
        # placeholder public address instead. It is only the text the router
        # reports; no packet is ever sent to it (peers confirm the address
        # that works by dialling back the one they see).
        conf.write_text(
            "ext_ifname=wan\nlistening_ip=lan\nport=0\nenable_upnp=yes\nenable_natpmp=no\n"
            f"ext_ip={UPNP_PLACEHOLDER_IP}\nsecure_mode=yes\nsystem_uptime=yes\n"
            "uuid=3d3cec3a-8cf0-11e0-98ee-001a6bd2d07b\n"
            f"allow 1024-65535 {home.lan}.0/24 1024-65535\ndeny 0-65535 0.0.0.0/0 0-65535\n"
        )
        daemon = subprocess.Popen(
            ["ip", "netns", "exec", home.ns, "miniupnpd", "-d", "-f", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._daemons.append((daemon, conf.parent))

    def host_in(self, home: Home, name: str) -> Machine:
        """A machine on ``home``'s LAN, routed through its router."""
        ns = f"{self.prefix}-{name}"
        self._ns(ns)
        home.hosts += 1
        ip = f"{home.lan}.{home.hosts + 1}"
        port = f"{self.prefix[:6]}{len(self._namespaces)}l"
        sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", port, "netns", home.ns)
        self._in(home.ns, "ip", "link", "set", port, "master", "lan")
        self._in(home.ns, "ip", "link", "set", port, "up")
        self._in(ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        self._in(ns, "ip", "link", "set", "eth0", "up")
        self._in(ns, "ip", "route", "add", "default", "via", f"{home.lan}.1")
        machine = self.machines[name] = Machine(name, ns, ip)
        return machine

    def cap_upload(self, name: str, mbit: float) -> None:
        """Limit what machine ``name`` sends to ``mbit`` Mbit/s (token bucket on its NIC)."""
        self._in(
            self.machines[name].ns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            f"{mbit}mbit",
            "burst",
            "64kb",
            "latency",
            "400ms",
        )

    # --- using --------------------------------------------------------------

    def prefix_argv(self, name: str) -> list[str]:
        """The command prefix that runs a program on machine ``name``."""
        return ["ip", "netns", "exec", self.machines[name].ns]
