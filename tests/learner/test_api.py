"""The status API's HTTP layer over a real socket: routing, errors, bounds."""

import json

import pytest
import trio

import echo_learner.operator.api as api
from echo_learner.operator.api import (
    JSON,
    MAX_ANSWERS_PER_S,
    MAX_REQUEST_BYTES,
    BadRequest,
    Body,
    Gate,
    Server,
    Snapshots,
    _handle,
    allowed_hosts,
    respond,
)


def boom(query):
    raise KeyError("a bug")


def limit(query):
    if query.get("limit") != ["3"]:
        raise BadRequest("limit must be 3")
    return {"ok": True}


TABLE = {"/api/ok": lambda q: {"ok": 1, "q": q}, "/api/limit": limit, "/api/boom": boom}


def test_respond_routes_and_maps_errors_to_status_codes():
    assert respond(TABLE, "GET", "/api/ok?x=1") == (200, Body(JSON, json.dumps({"ok": 1, "q": {"x": ["1"]}}).encode()))
    assert respond(TABLE, "GET", "/api/missing")[0] == 404
    assert respond(TABLE, "POST", "/api/ok")[0] == 405
    assert respond(TABLE, "GET", "/api/limit?limit=4")[0] == 400
    assert respond(TABLE, "GET", "/api/boom") == (500, Body(JSON, b'{"error": "internal error"}'))


async def _exchange(raw: bytes, hosts=None, token="", server=None) -> bytes:
    server = server or Server.for_table(TABLE, hosts=hosts, token=token)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            async with stream:
                try:
                    await _handle(stream, server)
                except Exception:
                    pass  # the server logs and drops a bad request; the test reads what arrived

        await nursery.start(trio.serve_listeners, handler, listeners)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(raw)
        data = b""
        with trio.fail_after(10):
            try:
                while chunk := await client.receive_some(65536):
                    data += chunk
            except trio.BrokenResourceError:
                pass  # the server closed with our unread excess: a reset after its answer
        nursery.cancel_scope.cancel()
    return data


async def test_a_real_request_gets_json():
    reply = await _exchange(b"GET /api/ok HTTP/1.1\r\nHost: x\r\n\r\n")
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"application/json" in head
    assert json.loads(body) == {"ok": 1, "q": {}}


async def test_an_oversized_request_is_refused():
    reply = await _exchange(b"GET /api/ok HTTP/1.1\r\nX-Big: " + b"a" * (2 * MAX_REQUEST_BYTES) + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 431")


async def test_garbage_gets_a_400():
    reply = await _exchange(b"\x00\x01 not http\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")


async def test_only_the_bound_address_is_answered_against_dns_rebinding():
    hosts = allowed_hosts("127.0.0.1", 8123)
    assert hosts == {"127.0.0.1:8123", "localhost:8123", "[::1]:8123"}
    assert allowed_hosts("0.0.0.0", 8123) is None  # every interface: any name may lead here
    for host in (b"localhost:8123", b"127.0.0.1:8123", b"LOCALHOST:8123"):
        reply = await _exchange(b"GET /api/ok HTTP/1.1\r\nHost: " + host + b"\r\n\r\n", hosts)
        assert reply.startswith(b"HTTP/1.1 200"), reply
    for host in (b"evil.example:8123", b"127.0.0.1:80", b"localhost"):
        reply = await _exchange(b"GET /api/ok HTTP/1.1\r\nHost: " + host + b"\r\n\r\n", hosts)
        assert reply.startswith(b"HTTP/1.1 421") and b'"ok"' not in reply, reply


async def test_beyond_loopback_only_the_public_summary_is_answered_without_the_token():
    table = {**TABLE, "/api/status": lambda q: {"summary": 1}}
    server = Server.for_table(table, token="s3cret")

    def ask(path, extra=b""):
        return _exchange(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n", server=server)

    assert (await ask(b"/api/status")).startswith(b"HTTP/1.1 200")
    assert (await ask(b"/api/ok")).startswith(b"HTTP/1.1 401")
    assert (await ask(b"/api/ok", b"Authorization: Bearer wrong\r\n")).startswith(b"HTTP/1.1 401")
    assert (await ask(b"/api/ok", b"Authorization: Bearer s3cret\r\n")).startswith(b"HTTP/1.1 200")


async def test_a_request_dripped_byte_by_byte_is_cut_off(monkeypatch):
    monkeypatch.setattr(api, "REQUEST_DEADLINE_S", 0.3)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    server = Server.for_table(TABLE)
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            async with stream:
                await _handle(stream, server)

        await nursery.start(trio.serve_listeners, handler, listeners)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(b"GET /api/ok HTTP/1.1\r\n")  # and nothing more
        data = b""
        with trio.fail_after(5):
            while chunk := await client.receive_some(65536):
                data += chunk
        nursery.cancel_scope.cancel()
    assert data.startswith(b"HTTP/1.1 408"), data


def test_answers_come_from_a_snapshot_at_most_once_a_second():
    calls = []
    snapshots = Snapshots({"/api/x": lambda q: calls.append(1) or {"n": len(calls)}}, max_age_s=60)
    first = snapshots.answer("GET", "/api/x")
    assert all(snapshots.answer("GET", "/api/x") == first for _ in range(100))
    assert len(calls) == 1
    expired = Snapshots(snapshots.table, max_age_s=0)
    expired.answer("GET", "/api/x"), expired.answer("GET", "/api/x")
    assert len(calls) == 3


async def test_the_cli_sends_the_token_its_url_names():
    """`echo-learner peers --url ...#token=` (what a learner bound beyond loopback prints)."""
    import sys

    table = {"/api/status": lambda q: {}, "/api/peers": lambda q: {"peers": [{"peer": "12D3KooWexample"}]}}
    server = Server.for_table(table, token="s3cret")
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"

    async def handler(stream):
        async with stream:
            try:
                await _handle(stream, server)
            except trio.BrokenResourceError:
                pass  # the CLI hung up after a 401 (serve_api ignores this too)

    async def peers(url):
        return await trio.run_process(
            [sys.executable, "-m", "echo_learner", "peers", "--json", "--url", url],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        with trio.fail_after(60):
            good = await peers(url + "/#token=s3cret")
            none = await peers(url)
            wrong = await peers(url + "/#token=guess")
        nursery.cancel_scope.cancel()
    assert good.returncode == 0 and json.loads(good.stdout) == [{"peer": "12D3KooWexample"}], good.stderr
    for refused in (none, wrong):
        assert refused.returncode != 0 and b"401" in refused.stderr, refused.stderr


async def test_slow_request_heads_do_not_keep_others_waiting():
    """100 sockets trickling their request heads, then an honest request: it
    is answered while every slow socket is still open, long before their
    deadline. (When accepts were paced behind 32 connection slots, it waited
    for the slow ones to time out.)"""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(api.serve_http, Server.for_table(TABLE), listeners)
        slow = []
        for _ in range(100):
            sock = await trio.open_tcp_stream("127.0.0.1", port)
            await sock.send_all(b"GET /api/ok HTTP/1.1\r\n")  # and the rest never comes
            slow.append(sock)
        honest = await trio.open_tcp_stream("127.0.0.1", port)
        await honest.send_all(b"GET /api/ok HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        with trio.fail_after(api.REQUEST_DEADLINE_S / 2):
            while chunk := await honest.receive_some(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply
        # None of the slow ones has been answered (408) or closed yet.
        for sock in slow:
            with trio.move_on_after(0.001) as waiting:
                await sock.receive_some(1)
            assert waiting.cancelled_caught
        nursery.cancel_scope.cancel()


async def test_past_the_cap_the_oldest_slow_head_is_closed(monkeypatch):
    monkeypatch.setattr(api, "MAX_READING_HEADS", 4)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(api.serve_http, Server.for_table(TABLE), listeners)
        first = await trio.open_tcp_stream("127.0.0.1", port)
        await first.send_all(b"GET /api/ok HTTP/1.1\r\n")
        later = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(4)]  # kept: open
        for sock in later:
            await sock.send_all(b"GET /api/ok HTTP/1.1\r\n")
        with trio.fail_after(api.REQUEST_DEADLINE_S / 2):
            assert await first.receive_some(1) == b""  # closed, unanswered
        nursery.cancel_scope.cancel()


async def test_answers_are_paced_to_their_cap_a_second(autojump_clock):
    """However many ask at once, ``MAX_ANSWERS_PER_S`` answers a second after
    a first burst of as many (what keeps pollers from slowing training)."""
    gate, started, answered = Gate(), trio.current_time(), []

    async def ask():
        async with gate.answering():
            answered.append(trio.current_time() - started)

    async with trio.open_nursery() as nursery:
        for _ in range(int(4 * MAX_ANSWERS_PER_S)):
            nursery.start_soon(ask)
    burst = int(MAX_ANSWERS_PER_S)
    assert sum(t < 1e-9 for t in answered) == burst
    # Then one every 1 / MAX_ANSWERS_PER_S seconds: the last at 3 s.
    for i, t in enumerate(sorted(answered)[burst:], start=1):
        assert t == pytest.approx(i / MAX_ANSWERS_PER_S)
