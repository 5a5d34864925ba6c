"""The connection limits every process takes as flags (docs/limits.md).

Plain settings, so that a command's ``--help`` loads them without libp2p;
``host.connection_config`` and ``conngate.InboundGate`` put them to work.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.process.config import setting


@dataclass(frozen=True)
class ConnectionSettings:
    """What a host admits.

    py-libp2p counts a connection against its inbound cap (max_connections -
    50) from accept on, before the handshake, and so does conngate's per-address
    cap. A socket that has not finished its Noise handshake in time is closed.
    The deadline only sets how often an attacker who reconnects at once costs
    us an accept (each ~1 ms of the event loop); it does not change how many
    sockets such an attacker holds. So it is generous to slow and relayed links,
    as go-libp2p's 15 s accept timeout is.
    """

    max_connections: int = setting(
        1024, "connections at once, in all (idle ones are trimmed from 15/16 of this)", lo=128, hi=65536
    )
    connections_per_ip: int = setting(
        16, "inbound sockets at once from one IPv4 address or IPv6 /56 (loopback exempt)", lo=1, hi=65536
    )
    handshake_timeout_s: float = setting(
        10.0, "an inbound socket that has not finished its Noise handshake is closed after this", lo=0.5, hi=120
    )
