"""The learner's local HTTP JSON API: what ``echo-learner status`` and ``peers`` read.

A deliberately small HTTP/1.1 server (h11 on trio): GET only, one request per
connection, bounded request size, per-connection deadline and a cap on
concurrent connections, so a stuck or hostile client cannot hold the learner.
It binds to 127.0.0.1 unless told otherwise. Handlers only read the learner's
in-memory state and the ledger: serving never blocks training.

    GET /api/status              job, version, step, mode, utilization, capacity
    GET /api/peers               one entry per known node
    GET /api/history?limit=N     the newest N step records (reward curve)
    GET /api/ledger?limit=N      contributors, most credit first
    GET /api/refusals?limit=N    the newest refused batches
    GET /api/receipts?peer=ID    one node's signed receipts (hex), newest last
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from protocol.logs import event

if TYPE_CHECKING:
    from echo_learner.service import Learner

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024
CONNECTION_DEADLINE_S = 10.0
MAX_CONNECTIONS = 32
MAX_LIMIT = 5000
LINGER_S = 1.0
MAX_LINGER_BYTES = 256 * 1024


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


def _limit(query: dict[str, list[str]], default: int) -> int:
    raw = query.get("limit", [str(default)])[0]
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise BadRequest(f"limit must be an integer in [1, {MAX_LIMIT}]")
    return int(raw)


def routes(learner: Learner) -> dict[str, Callable[[dict[str, list[str]]], Any]]:
    def receipts(query: dict[str, list[str]]) -> Any:
        peer = query.get("peer", [""])[0]
        if not peer:
            raise BadRequest("peer=<peer id> is required")
        rows = learner.ledger.receipts(peer, 0, _limit(query, 1000))
        return {"peer": peer, "receipts": [{"id": i, "receipt": r.hex()} for i, r in rows]}

    return {
        "/api/status": lambda q: learner.status(),
        "/api/peers": lambda q: {"peers": learner.peers.to_json()},
        "/api/history": lambda q: {"steps": list(learner.history)[-_limit(q, 1000):]},
        "/api/ledger": lambda q: {
            "contributors": [asdict(s) for s in learner.ledger.leaderboard(_limit(q, 100))]
        },
        "/api/refusals": lambda q: {"refusals": learner.ledger.refusals(_limit(q, 50))},
        "/api/receipts": receipts,
    }


def respond(table: dict[str, Callable[[dict[str, list[str]]], Any]], method: str, target: str) -> tuple[int, bytes]:
    """(status code, JSON body) for one request."""
    url = urlsplit(target)
    try:
        if method != "GET":
            return 405, json.dumps({"error": "only GET"}).encode()
        handler = table.get(url.path)
        if handler is None:
            raise NotFound(f"no such endpoint: {url.path}")
        return 200, json.dumps(handler(parse_qs(url.query))).encode()
    except NotFound as exc:
        return 404, json.dumps({"error": str(exc)}).encode()
    except BadRequest as exc:
        return 400, json.dumps({"error": str(exc)}).encode()
    except Exception as exc:  # a bug in a route must never stop the learner
        event(log, logging.WARNING, "status API error", path=url.path, error=repr(exc))
        return 500, json.dumps({"error": "internal error"}).encode()


async def _handle(stream: trio.SocketStream, table: dict) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    while True:
        try:
            event_ = conn.next_event()
        except h11.RemoteProtocolError as exc:  # malformed or oversized: say so, then close
            status, body = exc.error_status_hint, json.dumps({"error": str(exc)}).encode()
            break
        if event_ is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(MAX_REQUEST_BYTES))
            continue
        if isinstance(event_, h11.Request):
            status, body = respond(table, event_.method.decode(), event_.target.decode("latin-1"))
            break
        return  # closed or something unexpected: nothing to answer
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        ("cache-control", "no-store"),
        ("connection", "close"),
    ]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(conn.send(h11.Data(data=body)))
    await stream.send_all(conn.send(h11.EndOfMessage()))
    if status >= 400:
        await _linger(stream)


async def _linger(stream: trio.SocketStream) -> None:
    """Read (a bounded amount of) what the client is still sending before
    closing: closing with unread bytes makes the kernel send a reset, which can
    destroy our error response before the client reads it (RFC 9112, 9.6)."""
    await stream.send_eof()
    drained = 0
    with trio.move_on_after(LINGER_S):
        while drained < MAX_LINGER_BYTES:
            data = await stream.receive_some(MAX_REQUEST_BYTES)
            if not data:
                return
            drained += len(data)


async def serve_api(
    learner: Learner, host: str, port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the API until cancelled; reports its URL once listening."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]
    table = routes(learner)
    limiter = trio.CapacityLimiter(MAX_CONNECTIONS)

    async def handler(stream: trio.SocketStream) -> None:
        async with limiter, stream:
            with trio.move_on_after(CONNECTION_DEADLINE_S):
                try:
                    await _handle(stream, table)
                except (h11.ProtocolError, trio.BrokenResourceError) as exc:
                    event(log, logging.DEBUG, "bad http request", error=exc)

    task_status.started(f"http://{host}:{bound_port}/")
    await trio.serve_listeners(handler, listeners)
