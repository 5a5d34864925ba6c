"""What one request costs a py-libp2p server, on a new stream each time
against one long-lived stream: the floor under the learner's control CPU
per batch (issue 52), measured in the same run.

A server process (pinned to one core with ``--server-core``) answers framed
requests of ``--size`` bytes with an answer of the same size; a client
process connects once (Noise, yamux, as our hosts do) and sends
``--requests`` of them from ``--concurrency`` tasks, first each on a new
stream (open, negotiate the protocol, one request and answer, close), then
all on one stream per task, then a tenth as many each on a new connection
(a node that redials: Noise and yamux handshakes, identify). The server reports its own CPU seconds for each
phase, so the client's cost is not counted.

    python bench/stream_cost.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libp2p.peer.id import ID  # noqa: E402
from libp2p.peer.peerinfo import PeerInfo  # noqa: E402

from protocol.framing import read_frame, write_frame  # noqa: E402
from protocol.identity import Identity  # noqa: E402
from protocol.net.host import make_host, parse_multiaddr  # noqa: E402

PROTOCOL = "/echo-bench/echo/1.0.0"
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
MAX_FRAME = 1 << 20


async def serve(args: argparse.Namespace) -> None:
    """Answer every frame on every stream; print our address, then our CPU
    seconds each time the client asks on stdin."""
    host = make_host(Identity.generate(), [LOOPBACK])

    async def handle(stream) -> None:  # type: ignore[no-untyped-def]
        try:
            while True:
                body = await read_frame(stream, MAX_FRAME)
                await write_frame(stream, body)
        except Exception:
            pass  # the client closed the stream: this request's work is done
        finally:
            await stream.close()

    host.set_stream_handler(PROTOCOL, handle)
    async with host.run([parse_multiaddr(LOOPBACK)]):
        print(json.dumps({"peer": host.get_id().to_base58(), "addrs": [str(a) for a in host.get_addrs()]}), flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(0))
        buf = b""
        while True:
            chunk = await stdin.receive_some(64)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                _, buf = buf.split(b"\n", 1)
                print(json.dumps({"cpu_s": time.process_time()}), flush=True)


async def one_stream_each(host, peer: ID, count: int, body: bytes) -> None:  # type: ignore[no-untyped-def]
    for _ in range(count):
        stream = await host.new_stream(peer, [PROTOCOL])
        await write_frame(stream, body)
        await read_frame(stream, MAX_FRAME)
        await stream.close()


async def one_stream_for_all(host, peer: ID, count: int, body: bytes) -> None:  # type: ignore[no-untyped-def]
    stream = await host.new_stream(peer, [PROTOCOL])
    for _ in range(count):
        await write_frame(stream, body)
        await read_frame(stream, MAX_FRAME)
    await stream.close()


async def new_connection_each(peer_info: PeerInfo, count: int, body: bytes) -> None:
    for _ in range(count):
        host = make_host(Identity.generate(), [LOOPBACK])
        async with host.run([parse_multiaddr(LOOPBACK)]):
            await host.connect(peer_info)
            await one_stream_each(host, peer_info.peer_id, 1, body)
            await host.disconnect(peer_info.peer_id)


async def client(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--serve"]
    if args.server_core is not None:
        cmd = ["taskset", "-c", str(args.server_core)] + cmd
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(server.stdout.readline())

        def server_cpu() -> float:
            server.stdin.write("\n")
            server.stdin.flush()
            return json.loads(server.stdout.readline())["cpu_s"]

        host = make_host(Identity.generate(), [LOOPBACK])
        peer = ID.from_base58(hello["peer"])
        body = os.urandom(args.size)
        per_task = args.requests // args.concurrency
        figures = {}
        peer_info = PeerInfo(peer, [parse_multiaddr(a) for a in hello["addrs"]])
        async with host.run([parse_multiaddr(LOOPBACK)]):
            await host.connect(peer_info)
            phases = [
                ("new_stream", per_task, lambda n: one_stream_each(host, peer, n, body)),
                ("long_lived", per_task, lambda n: one_stream_for_all(host, peer, n, body)),
                # A connection each, as a node that lost its connection redials:
                # a tenth as many, since the client's side costs as much.
                ("new_connection", max(1, per_task // 10), lambda n: new_connection_each(peer_info, n, body)),
            ]
            for name, count, talk in phases:
                await talk(2)  # warm both ends' code paths
                before, started = server_cpu(), time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for _ in range(args.concurrency):
                        nursery.start_soon(talk, count)
                wall = time.perf_counter() - started
                done = count * args.concurrency
                figures[name] = {
                    "server_cpu_ms_per_request": round((server_cpu() - before) * 1000 / done, 3),
                    "requests_per_s": round(done / wall, 1),
                }
        figures["cpu_ratio"] = round(
            figures["long_lived"]["server_cpu_ms_per_request"] / figures["new_stream"]["server_cpu_ms_per_request"], 3
        )
        return {
            "size_bytes": args.size,
            "requests": per_task * args.concurrency,
            "concurrency": args.concurrency,
            **figures,
        }
    finally:
        server.stdin.close()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests in each phase (default 2000)")
    parser.add_argument("--concurrency", type=int, default=10, help="client tasks sending at once (default 10)")
    parser.add_argument("--size", type=int, default=1024, help="bytes of each request and answer (default 1024)")
    parser.add_argument("--server-core", type=int, default=0, help="pin the server to this core (default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.requests < args.concurrency or args.concurrency < 1 or args.size < 1:
        parser.error("--requests must be at least --concurrency, both and --size at least 1")
    if args.serve:
        trio.run(serve, args)
        return
    result = trio.run(client, args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
