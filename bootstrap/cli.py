"""``echo-bootstrap``: run a bootstrap peer (a Kademlia DHT server) for the swarm."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from protocol.net.connlimits import ConnectionSettings
from protocol.process.config import Parser, add_arguments, fail, resolve_or_exit, setting

PROG = "echo-bootstrap"
ENV_PREFIX = "ECHO_BOOTSTRAP"


@dataclass(frozen=True)
class BootstrapConfig(ConnectionSettings):
    listen: list[str] = setting(["/ip4/0.0.0.0/tcp/4001"], "multiaddr to listen on")
    identity: Path = setting(
        Path.home() / ".echo-swarm" / "bootstrap.key",
        "key file (created if absent); the same file always gives the same peer id",
    )
    bootstrap: list[str] = setting([], "other bootstrap peers to join (with /p2p/<id>)")
    bootstrap_timeout_s: float = setting(10.0, "deadline to dial one other bootstrap peer", lo=1)
    # The relay (circuit relay v2) that lets peers behind NAT be reached.
    relay_reservations: int = setting(128, "relay: most peers holding a reservation at once", lo=0)
    relay_circuits_per_peer: int = setting(8, "relay: most relayed connections to one peer at once", lo=1)
    relay_circuit_s: int = setting(600, "relay: a relayed connection is closed after this long", lo=1)
    relay_circuit_mb: int = setting(64, "relay: ... or after carrying this many MiB", lo=1)
    relay_reservation_s: int = setting(900, "relay: a reservation lapses unless renewed within this", lo=60)
    relay_per_range: int = setting(
        8, "relay: most reservations held from one IPv4 /24 or IPv6 /48 (loopback included) at once", lo=1
    )
    relay_known_share: float = setting(
        0.5, "relay: part of the reservations kept for known peers (peers unknown to it hold the rest)", lo=0, hi=1
    )
    relay_known_after_s: float = setting(600.0, "relay: a peer connected this long (now or before) is known", lo=0)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(
        prog=PROG,
        description="Run a bootstrap peer for an Echo Swarm: a long-lived Kademlia DHT server "
        "through which learners and volunteer nodes find each other, which also tells nodes "
        "whether they can be dialled from outside (AutoNAT dial-backs) and relays for nodes "
        "behind NAT (circuit relay v2, within the --relay-* limits). Prints its full "
        "multiaddr (give it to others as --bootstrap) and runs until Ctrl-C.",
    )
    add_arguments(parser, BootstrapConfig)
    parser.add_argument("-v", "--verbose", action="store_true", help="log DHT activity")
    args = parser.parse_args(argv)
    config = resolve_or_exit(PROG, BootstrapConfig, args, ENV_PREFIX)

    from protocol.process import logs

    logs.setup(args.verbose)

    import trio

    from protocol.identity import load_or_exit
    from protocol.net.host import BadMultiaddr, check_addrs, full_addrs
    from protocol.net.relay import RelayLimits
    from protocol.net.swarm import BootstrapUnreachable, connect_bootstrap, open_swarm
    from protocol.process.runtime import run_until_signal

    try:
        check_addrs(config.listen, config.bootstrap)
    except BadMultiaddr as exc:
        fail(PROG, str(exc))
    identity = load_or_exit(PROG, config.identity)

    async def serve() -> None:
        limits = RelayLimits(
            max_reservations=config.relay_reservations,
            circuits_per_peer=config.relay_circuits_per_peer,
            circuit_duration_s=config.relay_circuit_s,
            circuit_bytes=config.relay_circuit_mb * 2**20,
            reservation_ttl_s=config.relay_reservation_s,
            per_range=config.relay_per_range,
            known_share=config.relay_known_share,
            known_after_s=config.relay_known_after_s,
        )
        async with open_swarm(
            identity,
            config.listen,
            server=True,
            answer_probes=True,
            relay_hop=True,
            relay_limits=limits,
            connections=config,
        ) as swarm:
            await connect_bootstrap(swarm, config.bootstrap, config.bootstrap_timeout_s)
            for addr in full_addrs(swarm.host):
                print(addr, flush=True)
            await trio.sleep_forever()

    try:
        run_until_signal(serve)
    except (BadMultiaddr, BootstrapUnreachable) as exc:
        fail(PROG, str(exc))
    print("bootstrap stopped", flush=True)
    sys.exit(0)
