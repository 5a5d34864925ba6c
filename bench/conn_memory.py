"""What py-libp2p holds in memory per connected peer, apart from the learner.

A server process (our host settings: Noise, yamux, ``protocol.net.host``)
echoes framed messages on one kept stream per peer; this process starts
client hosts one by one, each connecting, opening its stream and exchanging
one ``--size``-byte message, and keeps them all connected. At each of
``--levels`` the server reports its VmRSS; ``rss_kib_per_connection`` is the
growth between the first and the last level over the connections added.
With ``--trace`` the server runs tracemalloc and reports what Python
allocated the same way, and the files that hold most of it (tracemalloc's
own bookkeeping makes the RSS figures of that run larger: read them from a
run without it).

    python bench/conn_memory.py --json
    python bench/conn_memory.py --trace --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import psutil
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


async def serve(trace: bool) -> None:
    """Echo on every stream; print our address, then our memory each time the client asks on stdin."""
    if trace:
        tracemalloc.start()
    host = make_host(Identity.generate(), [LOOPBACK])
    first: tracemalloc.Snapshot | None = None

    async def handle(stream) -> None:  # type: ignore[no-untyped-def]
        try:
            while True:
                await write_frame(stream, await read_frame(stream, MAX_FRAME))
        except Exception:
            pass  # the client went away

    def report() -> dict:
        nonlocal first
        out: dict = {"rss_kib": psutil.Process().memory_info().rss // 1024}
        if trace:
            out["traced_kib"] = tracemalloc.get_traced_memory()[0] // 1024
            snapshot = tracemalloc.take_snapshot()
            first = first or snapshot
            grown = snapshot.compare_to(first, "filename")[:10]
            out["files"] = [[d.traceback[0].filename.split("site-packages/")[-1], d.size_diff // 1024] for d in grown]
        return out

    host.set_stream_handler(PROTOCOL, handle)
    async with host.run([parse_multiaddr(LOOPBACK)]):
        print(json.dumps({"peer": host.get_id().to_base58(), "addrs": [str(a) for a in host.get_addrs()]}), flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(0))
        buf = b""
        while chunk := await stdin.receive_some(64):
            buf += chunk
            while b"\n" in buf:
                _, buf = buf.split(b"\n", 1)
                print(json.dumps(report()), flush=True)


async def connect_one(server: PeerInfo, size: int, task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
    """A client host connected to ``server`` with one kept stream, until cancelled."""
    host = make_host(Identity.generate(), [LOOPBACK])
    async with host.run([parse_multiaddr(LOOPBACK)]):
        await host.connect(server)
        stream = await host.new_stream(server.peer_id, [PROTOCOL])
        await write_frame(stream, os.urandom(size))
        await read_frame(stream, MAX_FRAME)
        task_status.started()
        await trio.sleep_forever()


async def measure(args: argparse.Namespace) -> dict:
    levels = sorted(int(x) for x in args.levels.split(","))
    cmd = [sys.executable, __file__, "--serve", *(["--trace"] if args.trace else [])]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        hello = json.loads(server.stdout.readline())

        def server_memory() -> dict:
            server.stdin.write("\n")
            server.stdin.flush()
            return json.loads(server.stdout.readline())

        info = PeerInfo(ID.from_base58(hello["peer"]), [parse_multiaddr(a) for a in hello["addrs"]])
        seen: dict[int, dict] = {}
        async with trio.open_nursery() as nursery:
            connected = 0
            for level in levels:
                while connected < level:
                    await nursery.start(connect_one, info, args.size)
                    connected += 1
                seen[level] = server_memory()
            nursery.cancel_scope.cancel()
    finally:
        server.stdin.close()
        server.wait(30)
    lo, hi = levels[0], levels[-1]
    result: dict = {
        "levels": {str(n): {k: v for k, v in m.items() if k != "files"} for n, m in seen.items()},
        "rss_kib_per_connection": round((seen[hi]["rss_kib"] - seen[lo]["rss_kib"]) / (hi - lo), 1),
    }
    if args.trace:
        result["traced_kib_per_connection"] = round((seen[hi]["traced_kib"] - seen[lo]["traced_kib"]) / (hi - lo), 1)
        result["grown_most_kib"] = seen[hi]["files"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="100,300", help="connections at which the server's memory is read")
    parser.add_argument("--size", type=int, default=2000, help="bytes of the one message each peer exchanges")
    parser.add_argument("--trace", action="store_true", help="run the server under tracemalloc too")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(serve, args.trace)
        return
    if len(args.levels.split(",")) < 2:
        parser.error("--levels needs two levels at least")
    result = trio.run(measure, args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
