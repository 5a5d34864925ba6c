"""One process of the broadcast benchmark: a seed or a node around the real engine.

Driven through JSON lines: it prints ``{"event": ...}`` lines on stdout and
the seed reads commands on stdin (``publish``). Used by bench/broadcast.py
and by the broadcast tests; it runs the same engine as echo-node and
echo-learner, without inference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=("seed", "node"), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--job-id", default="bench")
    parser.add_argument("--learner-id", default="", help="the seed's peer id (nodes)")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--upload-mbit", type=float, default=0.0)
    parser.add_argument("--size-mib", type=float, default=64.0, help="synthetic model size (seed)")
    parser.add_argument("--chunk-kib", type=int, default=512)
    parser.add_argument("--no-relay", action="store_true", help="never serve (star baseline)")
    parser.add_argument("--corrupt", action="store_true", help="serve corrupted chunks (tests)")
    parser.add_argument(
        "--stall", action="store_true", help="announce every chunk, download nothing and never answer chunk requests"
    )
    parser.add_argument("--request-timeout-s", type=float, default=10.0)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument(
        "--update-fraction",
        type=float,
        default=0.0,
        help="seed: publish each version after the first as a delta against v0 that changes this fraction of its bytes",
    )
    parser.add_argument(
        "--staged",
        type=Path,
        default=None,
        help="seed: publish the versions of this version store (signed with this "
        "seed's identity, e.g. by bench/delta.py) one per publish, instead of random ones",
    )
    parser.add_argument("--max-peers", type=int, default=16)
    parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    parser.add_argument(
        "--behind-nat",
        action="store_true",
        help="hold a relay reservation on the bootstrap peer (a node nobody can dial)",
    )
    args = parser.parse_args()

    from protocol.process import logs

    logs.setup(os.environ.get("BENCH_VERBOSE") == "1")

    import trio
    from fakes import claim_everything
    from libp2p.peer.id import ID

    from protocol import manifest as manifests
    from protocol.broadcast.engine import BroadcastConfig, BroadcastEngine
    from protocol.broadcast.store import VersionStore
    from protocol.identity import load_or_create
    from protocol.models import updates
    from protocol.net.dial import current_route
    from protocol.net.swarm import connect_bootstrap, open_swarm
    from protocol.process.runtime import run_until_signal
    from protocol.wire.chunk import ChunkRequest

    identity = load_or_create(args.data_dir / "identity.key")
    me = identity.peer_id_str
    learner_id = me if args.role == "seed" else args.learner_id
    config = BroadcastConfig(
        max_upload_mbit=args.upload_mbit,
        relay=not args.no_relay,
        max_peers=args.max_peers,
        discover_interval_s=0.5,
        request_timeout_s=args.request_timeout_s,
    )

    async def run() -> None:
        relays = [args.bootstrap] if args.behind_nat else []
        async with open_swarm(identity, [args.listen], server=not args.behind_nat, relays=relays) as swarm:
            await connect_bootstrap(swarm, [args.bootstrap], 10)
            store = VersionStore(args.data_dir / "weights", learner_id=learner_id, keep=args.keep)
            engine = BroadcastEngine(
                swarm,
                store,
                job_id=args.job_id,
                learner_id=learner_id,
                is_seed=args.role == "seed",
                config=config,
            )
            if args.corrupt:
                corrupt(engine)
            if args.stall:
                stall(engine)
            async with trio.open_nursery() as nursery:
                if args.behind_nat:
                    await nursery.start(swarm.relay.run)
                    swarm.relay.want(True)
                await nursery.start(engine.run)
                emit(event="ready", peer=me, resumed_chunks=sum(len(h) for h in store.held.values()))
                nursery.start_soon(report_neighbours, engine)
                if args.role == "seed":
                    await seed_commands(engine, identity)
                else:
                    await follow(engine)
                nursery.cancel_scope.cancel()

    async def report_neighbours(engine) -> None:
        last = -1
        while True:
            n = sum(1 for h in engine.neighbours.values() if h is not None)
            if n != last:
                emit(event="neighbours", n=n, cpu_s=time.process_time())
                last = n
            await trio.sleep(0.1)  # status sampling for the driver, not synchronisation

    def synthetic(identity, version: int, base):
        """A random version, or (--update-fraction) a delta against the first."""
        common = dict(
            job_id=args.job_id,
            version=version,
            parent_version=version - 1,
            task="bench",
            model_config="{}",
            tokenizer_digest=bytes(32),
            chunk_size=args.chunk_kib * 1024,
        )
        if base is None or not args.update_fraction:
            return manifests.build(identity, weights=os.urandom(int(args.size_mib * 2**20)), **common)
        base_m, base_weights = base
        weights = bytearray(base_weights)
        for i in random.sample(range(len(weights)), int(args.update_fraction * len(weights))):
            weights[i] ^= random.randrange(1, 256)
        payload = updates.encode_delta(base_weights, bytes(weights))
        return manifests.build(
            identity, weights=bytes(weights), update=manifests.Update(updates.DELTA, base_m, payload), **common
        )

    async def seed_commands(engine, identity) -> None:
        version = 0
        base = None
        staged = VersionStore(args.staged, learner_id=me, keep=10**6) if args.staged else None
        stdin = trio.wrap_file(sys.stdin)
        async for line in stdin:
            if line.strip() != "publish":
                continue
            if staged is not None:
                left = sorted(v for v in staged.manifests if v >= version)
                if not left:
                    emit(event="error", error="no staged version left")
                    continue
                version = left[0]
                m = staged.manifests[version]
                chunks = [staged.read(version, i) for i in range(len(m.chunk_hashes))]
            else:
                m, chunks = synthetic(identity, version, base)
                if base is None:
                    base = (m, b"".join(chunks))
            await engine.publish(m, chunks)
            emit(event="published", version=version, t=time.time(), chunks=len(chunks), cpu_s=time.process_time())
            version += 1

    def rebuilds_exactly(store, version: int) -> bool:
        """Every byte as signed (a LoRA version's merge is not bytes the learner signs)."""
        try:
            store.check_signed(version)
        except updates.UpdateRefused:
            return False
        return True

    async def follow(engine) -> None:
        done: set[int] = set()
        shown = None
        while True:
            m = engine.target
            if m is not None and (m.version, len(engine.store.chunks_held(m.version))) != shown:
                shown = (m.version, len(engine.store.chunks_held(m.version)))
                emit(event="progress", version=shown[0], held=shown[1])
            for version in [v for v in sorted(engine.store.manifests) if v not in done and engine.store.usable(v)]:
                done.add(version)
                emit(
                    event="complete",
                    version=version,
                    t=time.time(),
                    cpu_s=time.process_time(),
                    format=engine.store.manifests[version].format,
                    exact=await trio.to_thread.run_sync(rebuilds_exactly, engine.store, version),
                    bytes_from=dict(engine.stats.bytes_from),
                    banned=engine.stats.banned,
                    stalls=dict(engine.stats.stalls),
                    routes={
                        peer: current_route(engine.swarm.host, ID.from_base58(peer)) or "gone"
                        for peer in engine.neighbours
                    },
                    punches=engine.swarm.puncher.outcomes,
                    disk_bytes=engine.store.disk_bytes(),
                )
            await engine.wait_progress()

    def corrupt(engine) -> None:
        """Flip a byte of every chunk this process serves (a malicious peer)."""
        read = engine.store.read

        def bad_read(version: int, idx: int) -> bytes | None:
            data = read(version, idx)
            return None if data is None else bytes([data[0] ^ 0xFF]) + data[1:]

        engine.store.read = bad_read

    def stall(engine) -> None:
        """Announce every chunk of the newest version, download nothing, accept
        chunk requests and never answer them (a stalling or lying peer)."""
        answer = engine.server.answer

        async def silent(stream, req) -> None:
            if isinstance(req, ChunkRequest):
                await trio.sleep_forever()
            await answer(stream, req)

        def follow_without_downloading(m) -> None:
            engine.state.target = m
            engine.state.poke_local()  # announce it, and wake follow() to report it

        engine.server.answer = silent
        engine.haves.my_have = lambda: claim_everything(engine)
        engine.following.start_download = follow_without_downloading

    profile_to = os.environ.get("BENCH_PROFILE_DIR")
    if profile_to:  # where a node spends its CPU, for tuning the engine
        import cProfile

        with cProfile.Profile() as prof:
            run_until_signal(run)
        prof.dump_stats(Path(profile_to) / f"{args.role}-{me[-6:]}.prof")
    else:
        run_until_signal(run)


if __name__ == "__main__":
    main()
