"""The learner's local HTTP server: the JSON API that ``echo-learner status`` and
``peers`` read, the status web page built on it, and Prometheus metrics.

A deliberately small HTTP/1.1 server (h11 on trio): GET only, one request per
connection, bounded request size, per-connection deadline and a cap on
concurrent connections, so a stuck or hostile client cannot hold the learner.
It binds to 127.0.0.1 unless told otherwise, and then answers only requests
whose Host header names that address (or localhost): a web page elsewhere
cannot read it through DNS rebinding. Handlers only read the learner's
in-memory state and the ledger: serving never blocks training.

    GET /api/status              job, version, step, mode, utilization, capacity
    GET /api/peers               one entry per known node
    GET /api/history?limit=N     the newest N step records (reward curve)
    GET /api/ledger?limit=N      contributors, most credit first
    GET /api/refusals?limit=N    the newest refused batches
    GET /api/receipts?peer=ID    one node's receipts (fields, and the signed bytes in hex), oldest first
    GET /                        the status page (echo_learner/static/, no external assets)
    GET /metrics                 Prometheus metrics (echo_learner/metrics.py)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from echo_learner import metrics
from protocol import codec
from protocol.logs import event
from protocol.messages import Receipt

if TYPE_CHECKING:
    from echo_learner.service import Learner

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024
CONNECTION_DEADLINE_S = 10.0
MAX_CONNECTIONS = 32
MAX_LIMIT = 5000
LINGER_S = 1.0
MAX_LINGER_BYTES = 256 * 1024


JSON = "application/json"
# The page's files, read once: they ship inside the package.
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
# The page runs only its own script and styles, and talks only to this server.
PAGE_POLICY = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'"


@dataclass(frozen=True)
class Body:
    """A non-JSON answer."""

    content_type: str
    data: bytes


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
        out = []
        for i, raw in rows:
            r = codec.decode(raw, Receipt)
            out.append({"id": i, "version": r.version, "verdict": r.verdict, "reason": r.reason,
                        "tokens": r.tokens, "credit": r.credit, "created_ms": r.created_ms,
                        "receipt": raw.hex()})
        return {"peer": peer, "receipts": out}

    files = resources.files("echo_learner") / "static"
    pages = {path: Body(kind, (files / name).read_bytes()) for path, (name, kind) in STATIC.items()}
    return {
        **{path: (lambda q, body=body: body) for path, body in pages.items()},
        "/metrics": lambda q: Body(metrics.CONTENT_TYPE, metrics.render(learner).encode()),
        "/api/status": lambda q: learner.status(),
        "/api/peers": lambda q: {"peers": learner.peers.to_json()},
        "/api/history": lambda q: {"steps": list(learner.history)[-_limit(q, 1000):]},
        "/api/ledger": lambda q: {
            "contributors": [asdict(s) for s in learner.ledger.leaderboard(_limit(q, 100))]
        },
        "/api/refusals": lambda q: {"refusals": learner.ledger.refusals(_limit(q, 50))},
        "/api/receipts": receipts,
    }


def respond(
    table: dict[str, Callable[[dict[str, list[str]]], Any]], method: str, target: str
) -> tuple[int, Body]:
    """(status code, body) for one request: JSON unless the route says otherwise."""
    url = urlsplit(target)
    try:
        if method != "GET":
            return 405, _json({"error": "only GET"})
        handler = table.get(url.path)
        if handler is None:
            raise NotFound(f"no such endpoint: {url.path}")
        answer = handler(parse_qs(url.query))
        return 200, answer if isinstance(answer, Body) else _json(answer)
    except NotFound as exc:
        return 404, _json({"error": str(exc)})
    except BadRequest as exc:
        return 400, _json({"error": str(exc)})
    except Exception as exc:  # a bug in a route must never stop the learner
        event(log, logging.WARNING, "status API error", path=url.path, error=repr(exc))
        return 500, _json({"error": "internal error"})


def _json(obj: Any) -> Body:
    return Body(JSON, json.dumps(obj).encode())


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host headers a browser sends for this server (None: any, when it is
    bound to every interface and any name may lead to it)."""
    if host in ("", "0.0.0.0", "::"):
        return None
    names = {host}
    if host in ("127.0.0.1", "::1", "localhost"):
        names |= {"127.0.0.1", "::1", "localhost"}
    return frozenset(f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names)


async def _handle(stream: trio.SocketStream, table: dict, hosts: frozenset[str] | None = None) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    while True:
        try:
            event_ = conn.next_event()
        except h11.RemoteProtocolError as exc:  # malformed or oversized: say so, then close
            status, body = exc.error_status_hint, _json({"error": str(exc)})
            break
        if event_ is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(MAX_REQUEST_BYTES))
            continue
        if isinstance(event_, h11.Request):
            host = dict(event_.headers).get(b"host", b"").decode("latin-1").lower()
            if hosts is not None and host not in hosts:
                status, body = 421, _json({"error": f"this server does not answer for Host {host!r}"})
            else:
                status, body = respond(table, event_.method.decode(), event_.target.decode("latin-1"))
            break
        return  # closed or something unexpected: nothing to answer
    headers = [
        ("content-type", body.content_type),
        ("content-length", str(len(body.data))),
        ("cache-control", "no-store"),
        ("x-content-type-options", "nosniff"),
        ("content-security-policy", PAGE_POLICY),
        ("connection", "close"),
    ]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(conn.send(h11.Data(data=body.data)))
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
    hosts = allowed_hosts(host, bound_port)
    limiter = trio.CapacityLimiter(MAX_CONNECTIONS)

    async def handler(stream: trio.SocketStream) -> None:
        async with limiter, stream:
            with trio.move_on_after(CONNECTION_DEADLINE_S):
                try:
                    await _handle(stream, table, hosts)
                except (h11.ProtocolError, trio.BrokenResourceError) as exc:
                    event(log, logging.DEBUG, "bad http request", error=exc)

    task_status.started(f"http://{host}:{bound_port}/")
    await trio.serve_listeners(handler, listeners)
