"""libp2p glue for the stream protocols of ``protocol.wire``.

``request`` opens a stream and runs a protocol's client side on it; ``serve``
wraps a server-side handler so that
a misbehaving peer (bad bytes, oversized frame, stream cut) costs only its own
stream, logged with its peer id, and every stream is closed.

Kept streams (``KeptStreams`` on the client, ``serve_kept`` on the server)
carry one exchange after another, for the protocols whose newer versions
allow it (work and rollout): a stream costs a py-libp2p server ~1.7 ms of
CPU to open, negotiate and close, an exchange on a kept one ~0.4 ms
(``python bench/stream_cost.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import trio
from libp2p.abc import IHost, INetStream
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID

from protocol import framing
from protocol.errors import ProtocolError
from protocol.process.logs import event

log = logging.getLogger(__name__)
T = TypeVar("T")

# A server closes a kept stream that carried nothing for this long; a client
# reuses one only within KEPT_REUSE_S of its last exchange, a minute inside
# it. Minutes, not seconds: a laptop's assignment and a volunteer resting
# between assignments outlast 30 s, and a new stream costs the learner ~5x an
# exchange on a kept one (bench/stream_cost.py). At 1,000 identities offering
# 70 % of saturation, 30 s of reuse opened a stream for 40 % of exchanges.
KEPT_IDLE_S = 300.0
KEPT_REUSE_S = 240.0


class RequestFailed(ConnectionError):
    """A request that got no valid answer.

    It is not known whether the remote processed the request.
    """


def remote_peer(stream: INetStream) -> str:
    return stream.muxed_conn.peer_id.to_base58()


def route(conn: Any) -> str:
    """How a connection (a stream's ``muxed_conn``, or one of the network's)
    reaches the peer: ``direct``, ``relayed via <relay peer id>``, or just
    ``relayed`` on the side that was dialled (its transport address names
    itself where the dialler's names the relay)."""
    try:
        addrs = [str(a) for a in conn.get_transport_addresses()]
    except (AttributeError, NotImplementedError):
        return "direct"
    muxed = getattr(conn, "muxed_conn", conn)
    me = getattr(getattr(muxed, "secured_conn", None), "local_peer", None)
    for addr in addrs:
        if "/p2p-circuit" in addr:
            relay = addr.split("/p2p-circuit", 1)[0].rsplit("/p2p/", 1)[-1]
            if me is not None and relay == me.to_base58():
                return "relayed"
            return f"relayed via {relay}"
    return "direct"


async def request(
    host: IHost,
    peer: ID,
    protocol: str,
    talk: Callable[[INetStream], Awaitable[T]],
    *,
    timeout_s: float,
) -> T:
    """Open a stream to ``peer`` for ``protocol``, run ``talk`` on it (a client
    side from ``protocol.wire``) and close it; ``RequestFailed`` on any failure."""
    stream = None
    try:
        with _as_request_failed(protocol, peer, timeout_s):
            stream = await host.new_stream(peer, [protocol])
            return await talk(stream)
    finally:
        if stream is not None:
            await _close(stream)


@contextmanager
def _as_request_failed(protocol: str, peer: ID, timeout_s: float) -> Iterator[None]:
    """Run the block within ``timeout_s``; any failure but a cancellation
    comes out as ``RequestFailed``."""
    try:
        with trio.fail_after(timeout_s):
            yield
    except ProtocolError as exc:
        raise RequestFailed(f"{protocol} to {peer}: {exc}") from exc
    except trio.TooSlowError:
        raise RequestFailed(f"{protocol} to {peer}: no answer in {timeout_s} s") from None
    except trio.Cancelled:
        raise
    except Exception as exc:  # libp2p stream/dial errors have no common base
        raise RequestFailed(f"{protocol} to {peer}: {type(exc).__name__}: {exc}") from exc


Handler = Callable[[INetStream], Awaitable[None]]


def serve(protocol: str, handler: Handler, timeout_s: float) -> Handler:
    """Wrap ``handler`` with a deadline, per-peer error logging and stream cleanup."""

    async def wrapped(stream: INetStream) -> None:
        try:
            with _logged_failures(protocol, stream), trio.fail_after(timeout_s):
                await handler(stream)
        finally:
            await _close(stream)

    return wrapped


@contextmanager
def _logged_failures(protocol: str, stream: INetStream) -> Iterator[None]:
    """What a misbehaving peer does to a stream we serve: logged with its peer id, not raised."""
    try:
        yield
    except ProtocolError as exc:
        event(log, logging.INFO, "refused stream", protocol=protocol, peer=remote_peer(stream), error=exc)
    except trio.TooSlowError:
        event(log, logging.INFO, "stream timed out", protocol=protocol, peer=remote_peer(stream))
    except StreamError as exc:
        event(log, logging.INFO, "stream broke", protocol=protocol, peer=remote_peer(stream), error=exc)


class KeptStreams:
    """A client's streams of kept-stream protocols, reused between exchanges.

    ``request`` takes an idle stream to ``peer`` of the first of
    ``protocols`` (the version whose streams carry one exchange after
    another), or opens a new stream proposing all of them: a peer that only
    speaks an older version gets one exchange on that stream, as before.
    After a whole exchange the stream is kept, at most ``per_peer`` of them
    per peer and protocol and each for ``idle_s`` (under the server's
    ``KEPT_IDLE_S``, so that a kept stream is not one the server just
    closed). A failed exchange closes its stream: whether the remote
    processed the request is not known, so nothing is retried here.
    """

    def __init__(self, host: IHost, *, idle_s: float, per_peer: int = 2):
        self.host = host
        self.idle_s = idle_s
        self.per_peer = per_peer
        self._idle: dict[tuple[ID, str], list[tuple[INetStream, float]]] = {}
        self.opened = 0  # streams opened, for tests and benches
        self.reused = 0  # exchanges on a kept stream

    async def request(
        self,
        peer: ID,
        protocols: tuple[str, ...],
        talk: Callable[[INetStream], Awaitable[T]],
        *,
        timeout_s: float,
    ) -> T:
        """Like ``request``, on a kept stream where one is idle."""
        kept_protocol = protocols[0]
        stream, stale = self._take(peer, kept_protocol)
        for old in stale:
            await _close(old)
        whole = False
        try:
            with _as_request_failed(kept_protocol, peer, timeout_s):
                if stream is None:
                    stream = await self.host.new_stream(peer, list(protocols))
                    self.opened += 1
                else:
                    self.reused += 1
                result = await talk(stream)
            whole = True
            return result
        finally:
            kept = whole and stream.get_protocol() == kept_protocol and self._keep(peer, kept_protocol, stream)
            if stream is not None and not kept:
                await _close(stream)

    def _take(self, peer: ID, protocol: str) -> tuple[INetStream | None, list[INetStream]]:
        """The newest idle stream still usable, and those too old to use (the
        server may be closing them), that the server closed already, or whose
        connection is gone. A request sent on a stream the server closed fails
        and is not resent: a batch would be lost."""
        idle = self._idle.get((peer, protocol), [])
        now, stale = trio.current_time(), []
        while idle:
            stream, since = idle.pop()
            gone = getattr(stream.muxed_conn, "is_closed", False)
            closed_there = getattr(stream.muxed_stream, "recv_closed", False)  # yamux saw the server's FIN
            if now - since < self.idle_s and not (gone or closed_there):
                return stream, stale
            stale.append(stream)
        return None, stale

    def _keep(self, peer: ID, protocol: str, stream: INetStream) -> bool:
        idle = self._idle.setdefault((peer, protocol), [])
        if len(idle) >= self.per_peer:
            return False
        idle.append((stream, trio.current_time()))
        return True


async def _close(stream: INetStream) -> None:
    with trio.move_on_after(1):
        try:
            await stream.close()
        except Exception:
            pass  # already reset by the remote; nothing left to release


class _Resumed:
    """A stream whose first bytes were already read (the frame header that
    ended an idle wait): they are read again first."""

    def __init__(self, stream: INetStream, head: bytes):
        self._stream = stream
        self._head = head

    async def read(self, n: int | None = None) -> bytes:
        if self._head:
            size = len(self._head) if n is None else n
            piece, self._head = self._head[:size], self._head[size:]
            return piece
        return await self._stream.read(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def serve_kept(protocol: str, handler: Handler, timeout_s: float, idle_s: float) -> Handler:
    """Like ``serve``, for a protocol whose streams carry one exchange after
    another: ``handler`` runs once per exchange, each within ``timeout_s`` of
    its first byte. The stream ends when the peer closes it between
    exchanges, sends nothing for ``idle_s``, or an exchange fails."""

    async def wrapped(stream: INetStream) -> None:
        try:
            with _logged_failures(protocol, stream):
                while True:
                    head = None
                    with trio.move_on_after(idle_s):
                        head = await framing.next_frame_head(stream)
                    if head is None:
                        return  # closed between exchanges, or idle for idle_s
                    with trio.fail_after(timeout_s):
                        await handler(_Resumed(stream, head))  # type: ignore[arg-type]
        finally:
            await _close(stream)

    return wrapped
