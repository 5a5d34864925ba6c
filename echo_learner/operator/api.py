"""The learner's local HTTP server: the JSON API that ``echo-learner status`` and
``peers`` read, the status web page built on it, and Prometheus metrics.

A deliberately small HTTP/1.1 server (h11 on trio): GET only, one request per
connection, bounded request size, a deadline to send the request head
counted from the moment the connection is accepted, and one for the whole
exchange, so a stuck or hostile client cannot hold the learner.

Slow clients must not block others (slowloris): a connection still sending
its request head costs one waiting task, connections are accepted at once
(up to ``MAX_OPEN`` open, ``MAX_ACCEPTS_PER_S`` a second), and past
``MAX_READING_HEADS`` connections still sending their heads the oldest of
them is closed. When accepting was paced at 20 a second behind 32
connection slots, 100 sockets trickling their headers kept an honest request
waiting ~8 s in the kernel's backlog.

No number of clients may slow training (which shares this process): every
answer is computed at most once per ``SNAPSHOT_S`` and served from that
snapshot meanwhile, at most ``MAX_ANSWERS_PER_S`` answers a second and
``MAX_ANSWERING`` at once (the rest wait their turn).

It binds to 127.0.0.1 unless told otherwise, and then answers only requests
whose Host header names that address (or localhost): a web page elsewhere
cannot read it through DNS rebinding. Bound beyond loopback, every
path except the public summary (``/api/status`` and the page's own files)
requires the API token (``Authorization: Bearer TOKEN``; the page takes it
from its URL's ``#token=``).

    GET /api/status              job, version, step, mode, utilization, capacity
    GET /api/peers               one entry per known node
    GET /api/history?limit=N     the newest N step records (reward curve) and held-out scores
    GET /api/ledger?limit=N      contributors, most credit first
    GET /api/refusals?limit=N    the newest refused batches
    GET /api/receipts?peer=ID    one node's receipts (fields, and the signed bytes in hex), oldest first
    GET /                        the status page (echo_learner/operator/static/, no external assets)
    GET /metrics                 Prometheus metrics (echo_learner/metrics.py)
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from echo_learner import metrics
from protocol import codec
from protocol.broadcast.ratelimit import TokenBucket
from protocol.process.logs import event
from protocol.wire.rollout import Receipt

if TYPE_CHECKING:
    from echo_learner.ledger import Ledger
    from echo_learner.metrics import LearnerMetrics
    from echo_learner.swarm.peers import PeerBook
    from echo_learner.training.heldout import HeldoutMonitor


class Learner(Protocol):
    """What the API reads of the learner (``echo_learner.service.Learner``,
    which starts the API: it is imported by the service, never the other way)."""

    history: Sequence[dict]
    heldout: HeldoutMonitor
    ledger: Ledger
    metrics: LearnerMetrics
    peers: PeerBook

    def status(self) -> dict: ...


log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024
REQUEST_DEADLINE_S = 2.0  # to send the whole request head
CONNECTION_DEADLINE_S = 10.0
MAX_OPEN = 512  # connections open at once (past it, new ones wait in the kernel's backlog)
MAX_ACCEPTS_PER_S = 200.0
MAX_READING_HEADS = 256  # connections still sending their request head; past it the oldest is closed
MAX_ANSWERING = 32
# The page asks for 5 paths every 2 s (2.5 answers/s per viewer); why 10: docs/limits.md.
MAX_ANSWERS_PER_S = 10.0
ACCEPT_RETRY_S = 0.1
SNAPSHOT_S = 1.0
MAX_SNAPSHOTS = 256
MAX_LIMIT = 5000
LINGER_S = 1.0
MAX_LINGER_BYTES = 256 * 1024
# Answered without the token when the server is bound beyond loopback.
PUBLIC_PATHS = frozenset({"/", "/app.js", "/style.css", "/api/status"})
LOOPBACK = ("127.0.0.1", "::1", "localhost")

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
            out.append(
                {
                    "id": i,
                    "version": r.version,
                    "verdict": r.verdict,
                    "reason": r.reason,
                    "tokens": r.tokens,
                    "credit": r.credit,
                    "created_ms": r.created_ms,
                    "receipt": raw.hex(),
                }
            )
        return {"peer": peer, "receipts": out}

    files = resources.files("echo_learner.operator") / "static"
    pages = {path: Body(kind, (files / name).read_bytes()) for path, (name, kind) in STATIC.items()}
    return {
        **{path: (lambda q, body=body: body) for path, body in pages.items()},
        "/metrics": lambda q: Body(metrics.CONTENT_TYPE, learner.metrics.render()),
        "/api/status": lambda q: learner.status(),
        "/api/peers": lambda q: {
            "peers": [{**p, "evidence": learner.verifier.evidence.of(p["peer"])} for p in learner.peers.to_json()]
        },
        "/api/history": lambda q: {
            "steps": list(learner.history)[-_limit(q, 1000) :],
            "heldout": list(learner.heldout.results)[-_limit(q, 1000) :],
        },
        "/api/ledger": lambda q: {"contributors": [asdict(s) for s in learner.ledger.leaderboard(_limit(q, 100))]},
        "/api/refusals": lambda q: {"refusals": learner.ledger.refusals(_limit(q, 50))},
        "/api/receipts": receipts,
    }


def respond(table: dict[str, Callable[[dict[str, list[str]]], Any]], method: str, target: str) -> tuple[int, Body]:
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
    if host in LOOPBACK:
        names |= set(LOOPBACK)
    return frozenset(f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names)


class Snapshots:
    """Each (method, target) answered at most once per ``max_age_s``: however
    many clients poll, the learner's state is read a bounded number of times."""

    def __init__(self, table: dict, max_age_s: float = SNAPSHOT_S, max_entries: int = MAX_SNAPSHOTS):
        self.table = table
        self.max_age_s = max_age_s
        self.max_entries = max_entries
        self._cache: dict[tuple[str, str], tuple[float, tuple[int, Body]]] = {}

    def answer(self, method: str, target: str) -> tuple[int, Body]:
        now = time.monotonic()
        hit = self._cache.get((method, target))
        if hit is not None and now - hit[0] < self.max_age_s:
            return hit[1]
        answer = respond(self.table, method, target)
        if len(self._cache) >= self.max_entries:  # bounded: many distinct queries just miss
            self._cache.clear()
        self._cache[(method, target)] = (now, answer)
        return answer


@dataclass
class Server:
    """Everything a connection handler needs: the answers and the rules."""

    snapshots: Snapshots
    hosts: frozenset[str] | None = None  # Host headers answered (None: any)
    token: str = ""  # required beyond PUBLIC_PATHS ("": none)

    @classmethod
    def for_table(cls, table: dict, **kwargs: Any) -> Server:
        return cls(Snapshots(table), **kwargs)

    def answer(self, request: h11.Request) -> tuple[int, Body]:
        headers = dict(request.headers)
        host = headers.get(b"host", b"").decode("latin-1").lower()
        target = request.target.decode("latin-1")
        if self.hosts is not None and host not in self.hosts:
            return 421, _json({"error": f"this server does not answer for Host {host!r}"})
        if self.token and urlsplit(target).path not in PUBLIC_PATHS:
            given = headers.get(b"authorization", b"").decode("latin-1").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return 401, _json({"error": "this path needs the API token (Authorization: Bearer TOKEN)"})
        return self.snapshots.answer(request.method.decode(), target)


class Gate:
    """Who may hold the server, and for how long: connections still sending
    their request head are cheap, but at most ``MAX_READING_HEADS`` of them
    (past it the oldest is closed: an honest client sends its head at once,
    so the oldest is the slowest); answers are paced and at most
    ``MAX_ANSWERING`` at once."""

    def __init__(self) -> None:
        self._reading: dict[trio.CancelScope, None] = {}  # oldest first
        self._answering = trio.CapacityLimiter(MAX_ANSWERING)
        self._pace = TokenBucket(MAX_ANSWERS_PER_S, burst=int(MAX_ANSWERS_PER_S))

    @contextlib.contextmanager
    def reading_head(self) -> Iterator[trio.CancelScope]:
        with trio.CancelScope() as scope:
            self._reading[scope] = None
            if len(self._reading) > MAX_READING_HEADS:
                next(iter(self._reading)).cancel()
            try:
                yield scope
            finally:
                del self._reading[scope]

    @contextlib.asynccontextmanager
    async def answering(self) -> AsyncIterator[None]:
        async with self._answering:
            await self._pace.take(1)
            yield


async def _handle(stream: trio.SocketStream, server: Server, gate: Gate | None = None) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    with gate.reading_head() if gate else trio.CancelScope() as reading:
        got = await _read_head(stream, conn)
    if reading.cancelled_caught or got is None:
        return  # closed to make room for others, or the client left
    if isinstance(got, h11.Request):
        async with gate.answering() if gate else contextlib.AsyncExitStack():
            status, body = server.answer(got)
    else:
        status, body = got
    headers = [
        ("content-type", body.content_type),
        ("content-length", str(len(body.data))),
        ("cache-control", "no-store"),
        ("x-content-type-options", "nosniff"),
        ("content-security-policy", PAGE_POLICY),
        ("connection", "close"),
    ]
    try:
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
        await stream.send_all(conn.send(h11.Data(data=body.data)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
    except h11.LocalProtocolError:
        # A timed-out request that never got its head out: answer by hand.
        await stream.send_all(
            f"HTTP/1.1 {status} \r\ncontent-length: {len(body.data)}\r\nconnection: close\r\n\r\n".encode() + body.data
        )
    if status >= 400:
        await _linger(stream)


async def _read_head(stream: trio.SocketStream, conn: h11.Connection) -> h11.Request | tuple[int, Body] | None:
    """The request head; or the error to answer (status, body) if it is
    malformed, oversized or late; or None if the client went away."""
    with trio.move_on_after(REQUEST_DEADLINE_S):
        while True:
            try:
                event_ = conn.next_event()
            except h11.RemoteProtocolError as exc:  # malformed or oversized: say so, then close
                return exc.error_status_hint, _json({"error": str(exc)})
            if event_ is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(MAX_REQUEST_BYTES))
                continue
            if isinstance(event_, h11.Request):
                return event_
            return None  # closed or something unexpected: nothing to answer
    return 408, _json({"error": f"request not sent within {REQUEST_DEADLINE_S} s"})


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
    learner: Learner, host: str, port: int, token: str = "", *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the API until cancelled; reports its URL once listening (with
    ``#token=`` when a token guards it). Bound beyond loopback with no token
    given, it makes one up."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]
    if host not in LOOPBACK and not token:
        token = secrets.token_urlsafe(24)
    server = Server.for_table(routes(learner), hosts=allowed_hosts(host, bound_port), token=token)
    url = f"http://{host}:{bound_port}/"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_http, server, listeners)
        task_status.started(url + (f"#token={token}" if token else ""))


async def serve_http(
    server: Server, listeners: list[trio.SocketListener], *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """Answer connections on ``listeners`` until cancelled (the limits: module docstring)."""
    gate = Gate()
    open_slots = trio.Semaphore(MAX_OPEN)
    pace = TokenBucket(MAX_ACCEPTS_PER_S, burst=int(MAX_ACCEPTS_PER_S))

    async def handler(stream: trio.SocketStream) -> None:
        try:
            async with stream:
                with trio.move_on_after(CONNECTION_DEADLINE_S):
                    try:
                        await _handle(stream, server, gate)
                    except (h11.ProtocolError, trio.BrokenResourceError) as exc:
                        event(log, logging.DEBUG, "bad http request", error=exc)
        finally:
            open_slots.release()

    async def accept(listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            await open_slots.acquire()
            await pace.take(1)
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. out of file descriptors: wait for some to close
                open_slots.release()
                event(log, logging.WARNING, "status API cannot accept", error=exc)
                await trio.sleep(ACCEPT_RETRY_S)
                continue
            nursery.start_soon(handler, stream)

    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(accept, listener, nursery)
        task_status.started()
