"""An honest peer asking the bootstrap's relay for a reservation while a crowd
holds it (bench/attacks.py's relay_exhaustion).

It runs as its own process at normal priority, not inside the capped,
SCHED_IDLE attacker: what it sees is what an honest node would. It connects
to the relay and stays connected for ``--known-after-s`` (as a node is once
it has joined, before AutoNAT finds it private), prints ``{"known": true}``,
and waits for a line on stdin: the bench sends one once the whole crowd has
tried. Then, every ``--every-s``, it asks as itself over a fresh connection
(a node whose link dropped: ``honest_reserved`` / ``honest_refused``) and
under a fresh identity (``newcomer_*``: refused while strangers hold their
whole part, as designed), and prints its counts as one JSON line.

    python bench/relay_probe.py --bootstrap ADDR --known-after-s 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import trio
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from observe import json_reports  # noqa: E402  (bench/, this script's directory)

from protocol.identity import Identity  # noqa: E402
from protocol.net.host import make_host, parse_peer_addr  # noqa: E402
from protocol.net.relay_server import reserve_once  # noqa: E402

TIMEOUT_S = 30.0


async def probe(args: argparse.Namespace) -> None:
    relay = parse_peer_addr(args.bootstrap)
    counts: Counter[str] = Counter()

    async def ask(identity: Identity, who: str) -> None:
        host = make_host(identity, [])
        async with host.run([]):
            with trio.fail_after(TIMEOUT_S):
                await host.connect(relay)
                status = await reserve_once(await host.new_stream(relay.peer_id, [HOP_PROTOCOL]))
            counts[f"{who}_reserved" if status == StatusCode.OK else f"{who}_refused"] += 1
            await host.disconnect(relay.peer_id)

    me = Identity.generate()
    host = make_host(me, [])
    async with host.run([]):
        with trio.fail_after(TIMEOUT_S):
            await host.connect(relay)
        await trio.sleep(args.known_after_s)  # the time connected is what makes it known
        print(json.dumps({"known": True}), flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)  # the crowd has tried
        await host.disconnect(relay.peer_id)
    while True:
        await ask(me, "honest")
        await ask(Identity.generate(), "newcomer")
        print(json.dumps(counts), flush=True)
        await trio.sleep(args.every_s)


class ProbeProcess:
    """This script as a process of the bench's, its lines in ``log``."""

    def __init__(self, bootstrap: str, known_after_s: float, log: Path):
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--bootstrap", bootstrap, "--known-after-s", str(known_after_s)],
            stdin=subprocess.PIPE,
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def reports(self) -> list[dict]:
        return json_reports(self.log)

    def known(self) -> bool:
        """Has it been connected long enough to be known to the relay?"""
        return any(r.get("known") for r in self.reports())

    def crowd_tried(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def reserved(self) -> bool:
        """Did it get a reservation at every try (and try at least once)?"""
        last = self.reports()[-1]
        return bool(last.get("honest_reserved")) and not last.get("honest_refused")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="the relay's (bootstrap's) multiaddr")
    parser.add_argument("--known-after-s", type=float, required=True, help="the bootstrap's --relay-known-after-s")
    parser.add_argument("--every-s", type=float, default=5.0)
    args = parser.parse_args()
    try:
        trio.run(probe, args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
