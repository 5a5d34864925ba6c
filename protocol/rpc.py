"""libp2p glue for the stream protocols of ``protocol.wire``.

``request`` opens a stream and runs a protocol's client side on it; ``serve``
wraps a server-side handler so that
a misbehaving peer (bad bytes, oversized frame, stream cut) costs only its own
stream, logged with its peer id, and every stream is closed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from libp2p.abc import IHost, INetStream
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID

from protocol.errors import ProtocolError
from protocol.process.logs import event

log = logging.getLogger(__name__)
T = TypeVar("T")


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
        with trio.fail_after(timeout_s):
            stream = await host.new_stream(peer, [protocol])
            return await talk(stream)
    except ProtocolError as exc:
        raise RequestFailed(f"{protocol} to {peer}: {exc}") from exc
    except trio.TooSlowError:
        raise RequestFailed(f"{protocol} to {peer}: no answer in {timeout_s} s") from None
    except trio.Cancelled:
        raise
    except Exception as exc:  # libp2p stream/dial errors have no common base
        raise RequestFailed(f"{protocol} to {peer}: {type(exc).__name__}: {exc}") from exc
    finally:
        if stream is not None:
            with trio.move_on_after(1):
                try:
                    await stream.close()
                except Exception:
                    pass  # already reset by the remote; nothing left to release


Handler = Callable[[INetStream], Awaitable[None]]


def serve(protocol: str, handler: Handler, timeout_s: float) -> Handler:
    """Wrap ``handler`` with a deadline, per-peer error logging and stream cleanup."""

    async def wrapped(stream: INetStream) -> None:
        peer = remote_peer(stream)
        try:
            with trio.fail_after(timeout_s):
                await handler(stream)
        except ProtocolError as exc:
            event(log, logging.INFO, "refused stream", protocol=protocol, peer=peer, error=exc)
        except trio.TooSlowError:
            event(log, logging.INFO, "stream timed out", protocol=protocol, peer=peer)
        except StreamError as exc:
            event(log, logging.INFO, "stream broke", protocol=protocol, peer=peer, error=exc)
        finally:
            with trio.move_on_after(1):
                try:
                    await stream.close()
                except Exception:
                    pass  # the remote may have reset it already

    return wrapped
