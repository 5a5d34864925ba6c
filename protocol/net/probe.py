"""Two probes a node runs against a public peer (``echo-node doctor``).

**Hole punch** (``/echo-swarm/punch/1.0.0``): can two peers behind routers like
ours connect directly? The node sends the port it listens on; the public peer
binds a fresh port P, starts a TCP dial from P to the node's *observed* IP at
that port, and answers ``PunchReady(P)``; the node dials P from its listen
port. The two SYNs cross as in a DCUtR hole punch: a router that keeps the
source port and lets replies in passes them (a TCP simultaneous open), one
that maps ports randomly or refuses everything does not. The dials carry no
data and the server dials only the asker's own IP.

**Upload** (``/echo-swarm/upload/1.0.0``): the node sends ``UploadSample``
frames for about two seconds; the peer times first to last byte and answers
with ``UploadResult``.

Both servers are bounded: a few probes at a time, short deadlines, a cap on
the bytes taken.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import ClassVar

import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

from protocol import framing
from protocol.messages import MAX_U53, KiB
from protocol.rpc import serve
from protocol.schema import Bool, Bytes, Int, Str, check

# Answered by bootstrap peers and learners.
PUNCH_PROTOCOL = "/echo-swarm/punch/1.0.0"
UPLOAD_PROTOCOL = "/echo-swarm/upload/1.0.0"

PUNCH_TIMEOUT_S = 4.0
UPLOAD_S = 2.0
MAX_UPLOAD_BYTES = 16 * 1024 * 1024
SAMPLE = bytes(256 * 1024)
MAX_PROBES = 4  # at once, per server


@dataclass(frozen=True)
class PunchRequest:
    """Try a TCP hole punch with me: I will dial you from my listen ``port``."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    port: int = field(metadata=check(Int(1, 65535)))


@dataclass(frozen=True)
class PunchReady:
    """Dial me at ``port`` now; I am dialling your observed IP at your port."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    port: int = field(metadata=check(Int(1, 65535)))


@dataclass(frozen=True)
class PunchResult:
    """Whether my dial to you got through (``detail``: why not)."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    reached: bool = field(metadata=check(Bool()))
    detail: str = field(metadata=check(Str(200)))


@dataclass(frozen=True)
class UploadSample:
    """Bytes to time an upload with; an empty one ends the sample."""

    MAX_BYTES: ClassVar[int] = 256 * KiB + 1 * KiB

    data: bytes = field(metadata=check(Bytes(0, 256 * 1024)))


@dataclass(frozen=True)
class UploadResult:
    """How many sample bytes arrived, over how long (first to last byte)."""

    MAX_BYTES: ClassVar[int] = 1 * KiB

    received: int = field(metadata=check(Int(0, MAX_U53)))
    elapsed_ms: int = field(metadata=check(Int(0, MAX_U53)))


def _reuse_socket(family: int) -> trio.socket.SocketType:
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    # The listen port is already bound by the host's listener (which sets
    # SO_REUSEPORT for exactly this: dialling from the port peers see).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


async def _simultaneous_dial(sock: trio.socket.SocketType, ip: str, port: int) -> str:
    """Connect ``sock`` (already bound); '' on success, else why not."""
    try:
        with trio.fail_after(PUNCH_TIMEOUT_S):
            await sock.connect((ip, port))
        return ""
    except trio.TooSlowError:
        return "no answer"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    finally:
        sock.close()


class ProbeServer:
    """Serves both probes on ``host``."""

    def __init__(self, host: IHost):
        self._slots = trio.Semaphore(MAX_PROBES)
        host.set_stream_handler(PUNCH_PROTOCOL, serve(PUNCH_PROTOCOL, self.punch, 2 * PUNCH_TIMEOUT_S))
        host.set_stream_handler(UPLOAD_PROTOCOL, serve(UPLOAD_PROTOCOL, self.upload, 3 * UPLOAD_S))

    async def punch(self, stream: INetStream) -> None:
        req = await framing.receive(stream, PunchRequest)
        remote = stream.get_remote_address()
        if remote is None:  # over a relay: the IP would be the relay's
            await framing.send(stream, PunchResult(False, "asked over a relay"))
            return
        ip = remote[0]
        async with self._slots:
            sock = _reuse_socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
            await sock.bind(("", 0))
            port = sock.getsockname()[1]
            result: list[str] = []
            async with trio.open_nursery() as nursery:

                async def dial() -> None:
                    result.append(await _simultaneous_dial(sock, ip, req.port))

                nursery.start_soon(dial)
                await framing.send(stream, PunchReady(port))
        why = result[0]
        await framing.send(stream, PunchResult(not why, why or "reached"))

    async def upload(self, stream: INetStream) -> None:
        async with self._slots:
            received, first, last = 0, 0.0, 0.0
            while received <= MAX_UPLOAD_BYTES:
                sample = await framing.receive(stream, UploadSample)
                last = time.monotonic()
                if not sample.data:
                    break
                if not first:
                    first = last
                received += len(sample.data)
            await framing.send(stream, UploadResult(received, int((last - first) * 1000)))


@dataclass
class PunchOutcome:
    reached: bool
    detail: str


async def try_punch(host: IHost, peer: ID, listen_port: int, timeout_s: float) -> PunchOutcome:
    """Run the hole-punch probe against ``peer`` from ``listen_port``."""
    with trio.fail_after(timeout_s):
        stream = await host.new_stream(peer, [PUNCH_PROTOCOL])
        try:
            await framing.send(stream, PunchRequest(listen_port))
            ready = await framing.receive(stream, PunchReady)
            remote = stream.get_remote_address()
            if remote is None:
                return PunchOutcome(False, "only a relayed connection to the peer")
            ip = remote[0]
            sock = _reuse_socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
            await sock.bind(("", listen_port))
            ours = await _simultaneous_dial(sock, ip, ready.port)
            theirs = await framing.receive(stream, PunchResult)
        finally:
            await stream.close()
    if not ours or theirs.reached:
        return PunchOutcome(True, "direct connection made")
    return PunchOutcome(False, f"our dial: {ours}; theirs: {theirs.detail}")


async def measure_upload(host: IHost, peer: ID, timeout_s: float) -> float:
    """Bytes per second this host could upload to ``peer`` (about ``UPLOAD_S`` of sending)."""
    with trio.fail_after(timeout_s):
        stream = await host.new_stream(peer, [UPLOAD_PROTOCOL])
        try:
            started, sent = time.monotonic(), 0
            while time.monotonic() - started < UPLOAD_S and sent + len(SAMPLE) <= MAX_UPLOAD_BYTES:
                await framing.send(stream, UploadSample(SAMPLE))
                sent += len(SAMPLE)
            await framing.send(stream, UploadSample(b""))
            result = await framing.receive(stream, UploadResult)
        finally:
            await stream.close()
    return result.received / max(result.elapsed_ms / 1000, 1e-3)
