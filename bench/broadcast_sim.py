"""Discrete-event simulation of the weight broadcast, for swarms up to 10,000 nodes.

It drives the real scheduling code (``protocol.broadcast.scheduler``:
``Download`` on every requester, ``UploadPolicy`` on every uploader) over
simulated links; only the network is simulated:

- each process uploads at its own rate, shared equally by its ``slots``
  concurrent uploads (processor sharing); admitted requests beyond that wait
  in a FIFO queue, as in the real engine;
- every message (request, refusal, Have, the end of a chunk) arrives after the
  sum of the two ends' one-way latencies;
- Have announcements go to every neighbour when a chunk arrives;
- each process has up to ``max_peers`` random neighbours (the seed too);
- churn: ``--churn`` of the nodes leave at random times during the broadcast
  (their downloads stall; requesters notice after ``stall_s``) and as many new
  nodes join at random times, knowing nothing.

``--json`` prints completion-time percentiles of the nodes that stayed (from
the seed's announcement) and ``bound_s`` = size / the seed's upload rate.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.broadcast.engine import BroadcastConfig  # noqa: E402
from protocol.broadcast.scheduler import Download, SchedulerConfig, UploadPolicy  # noqa: E402

SEED = "seed"


@dataclass
class Transfer:
    requester: str
    idx: int
    remaining: float  # bytes


@dataclass
class Proc:
    name: str
    upload_Bps: float
    latency_s: float
    download: Download | None
    policy: UploadPolicy
    neighbours: set[str] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    active: list[Transfer] = field(default_factory=list)
    queue: list[Transfer] = field(default_factory=list)
    last_update: float = 0.0
    epoch: int = 0  # invalidates scheduled completions when the active set changes
    uploaded: float = 0.0  # bytes
    first_push_done: float | None = None  # the seed: every chunk sent once
    alive: bool = True
    joined_at: float = 0.0
    done_at: float | None = None
    wake_at: float = math.inf


class Simulation:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.seed)
        self.config = BroadcastConfig(
            upload_slots=args.upload_slots,
            upload_queue=args.upload_queue,
            scheduler=SchedulerConfig(
                max_in_flight_per_peer=args.per_peer, max_in_flight=args.in_flight
            ),
        )
        self.chunk = args.chunk_kib * 1024
        self.n_chunks = math.ceil(args.size_mib * 1024 / args.chunk_kib)
        self.events: list[tuple[float, int, object, tuple]] = []
        self.seq = 0
        self.now = 0.0
        self.procs: dict[str, Proc] = {}

    # --- event queue -------------------------------------------------------------

    def at(self, t: float, fn, *args) -> None:  # type: ignore[no-untyped-def]
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def run(self) -> None:
        while self.events:
            t, _, fn, args = heapq.heappop(self.events)
            self.now = t
            fn(*args)

    # --- setup -------------------------------------------------------------------

    def upload_rate(self) -> float:
        """Bytes/s: homogeneous, or log-normal between the given bounds."""
        a = self.args
        if not a.heterogeneous:
            return a.upload_mbit * 1e6 / 8
        lo, hi = math.log(a.min_mbit), math.log(a.max_mbit)
        mbit = math.exp(min(hi, max(lo, self.rng.gauss((lo + hi) / 2, (hi - lo) / 4))))
        return mbit * 1e6 / 8

    def add_proc(self, name: str, *, seed: bool, joined_at: float = 0.0) -> Proc:
        cfg = self.config
        proc = Proc(
            name=name,
            upload_Bps=self.args.upload_mbit * 1e6 / 8 if seed else self.upload_rate(),
            latency_s=self.args.latency_ms / 1000,
            download=None if seed else Download(
                self.n_chunks, set(), seed=SEED, config=cfg.scheduler,
                rng=random.Random(self.rng.random()),
            ),
            policy=UploadPolicy(self.n_chunks, cfg.upload_slots + cfg.upload_queue, seed),
            held=set(range(self.n_chunks)) if seed else set(),
            joined_at=joined_at,
        )
        self.procs[name] = proc
        return proc

    def connect(self, a: Proc, b: Proc) -> None:
        a.neighbours.add(b.name)
        b.neighbours.add(a.name)
        for x, y in ((a, b), (b, a)):
            if x.download is not None and y.held:
                x.download.update_peer(y.name, frozenset(y.held))

    def link_up(self, proc: Proc) -> None:
        """Connect ``proc`` to random live processes until it has enough neighbours."""
        limit = self.config.max_peers
        names = list(self.procs)
        # Random tries rather than a shuffle of everyone: O(limit) per process.
        for _ in range(limit * 8):
            if len(proc.neighbours) >= limit:
                break
            other = self.procs[names[self.rng.randrange(len(names))]]
            if (
                other is not proc
                and other.alive
                and len(other.neighbours) < limit
                and other.name not in proc.neighbours
            ):
                self.connect(proc, other)

    def build(self) -> None:
        seed = self.add_proc(SEED, seed=True)
        nodes = [self.add_proc(f"n{i}", seed=False) for i in range(self.args.nodes)]
        for proc in [seed, *nodes]:
            self.link_up(proc)
        bound = self.bound_s()
        leavers = self.rng.sample(nodes, int(self.args.churn * len(nodes)))
        for proc in leavers:
            self.at(self.rng.uniform(0, bound), self.leave, proc)
        for i in range(len(leavers)):
            self.at(self.rng.uniform(0, bound), self.join, f"j{i}")
        for proc in nodes:
            self.at(0.0, self.schedule, proc)

    def bound_s(self) -> float:
        return self.args.size_mib * 2**20 * 8 / (self.args.upload_mbit * 1e6)

    # --- churn -------------------------------------------------------------------

    def leave(self, proc: Proc) -> None:
        proc.alive = False
        for transfer in proc.active + proc.queue:
            # The requester only notices when its stall timer fires.
            self.at(self.now + self.config.stall_s, self.failed, transfer.requester, proc.name,
                    transfer.idx, "stalled")
        proc.active, proc.queue = [], []
        for name in proc.neighbours:
            other = self.procs[name]
            other.neighbours.discard(proc.name)
            if other.download is not None:
                other.download.remove_peer(proc.name)
        proc.neighbours.clear()

    def join(self, name: str) -> None:
        proc = self.add_proc(name, seed=False, joined_at=self.now)
        self.link_up(proc)
        self.schedule(proc)

    # --- requesting ----------------------------------------------------------------

    def schedule(self, proc: Proc) -> None:
        d = proc.download
        if not proc.alive or d is None or d.complete:
            return
        for peer, idx in d.next_requests(self.now):
            latency = proc.latency_s + self.procs[peer].latency_s
            self.at(self.now + latency, self.request_arrives, peer, proc.name, idx)
        wake = d.next_wakeup(self.now)
        if wake < proc.wake_at:
            proc.wake_at = wake
            self.at(wake, self.wake, proc)

    def wake(self, proc: Proc) -> None:
        if self.now >= proc.wake_at:
            proc.wake_at = math.inf
            self.schedule(proc)

    def failed(self, requester: str, peer: str, idx: int, outcome: str) -> None:
        proc = self.procs[requester]
        if not proc.alive or proc.download is None:
            return
        proc.download.on_failed(
            peer, idx, self.now, busy=outcome == "busy", declined=outcome == "ask_others"
        )
        self.schedule(proc)

    # --- uploading -----------------------------------------------------------------

    def holders(self, uploader: Proc, idx: int) -> int:
        return sum(1 for n in uploader.neighbours if idx in self.procs[n].held)

    def request_arrives(self, uploader_name: str, requester: str, idx: int) -> None:
        uploader = self.procs[uploader_name]
        if not uploader.alive:
            # It left while the request was on its way: the requester's stall
            # timer fires.
            self.at(self.now + self.config.stall_s, self.failed, requester, uploader_name, idx, "stalled")
            return
        latency = uploader.latency_s + self.procs[requester].latency_s
        verdict = uploader.policy.allow(idx, self.holders(uploader, idx))
        if verdict != "ok":
            self.at(self.now + latency, self.failed, requester, uploader_name, idx, verdict)
            return
        self.advance(uploader)
        uploader.queue.append(Transfer(requester, idx, float(self.chunk)))
        self.refill(uploader)

    def advance(self, up: Proc) -> None:
        """Account for bytes sent since the last change of the active set."""
        if up.active:
            share = (self.now - up.last_update) * up.upload_Bps / len(up.active)
            for t in up.active:
                t.remaining -= share
        up.last_update = self.now

    def refill(self, up: Proc) -> None:
        while up.queue and len(up.active) < self.config.upload_slots:
            up.active.append(up.queue.pop(0))
        up.epoch += 1
        if up.active:
            first = min(up.active, key=lambda t: t.remaining)
            eta = max(first.remaining, 0.0) * len(up.active) / up.upload_Bps
            self.at(self.now + eta, self.upload_done, up, up.epoch, first)

    def upload_done(self, up: Proc, epoch: int, transfer: Transfer) -> None:
        if epoch != up.epoch or not up.alive:
            return
        self.advance(up)
        up.active.remove(transfer)
        up.policy.finished(transfer.idx, ok=True)
        up.uploaded += self.chunk
        if up.first_push_done is None and min(up.policy.served) > 0 and not up.active:
            up.first_push_done = self.now
        latency = up.latency_s + self.procs[transfer.requester].latency_s
        self.at(self.now + latency, self.chunk_arrives, transfer.requester, up.name, transfer.idx)
        self.refill(up)

    def chunk_arrives(self, requester: str, uploader: str, idx: int) -> None:
        proc = self.procs[requester]
        if not proc.alive or proc.download is None:
            return
        proc.download.on_done(uploader, idx)
        proc.held.add(idx)
        if proc.download.complete and proc.done_at is None:
            proc.done_at = self.now
        for name in proc.neighbours:
            other = self.procs[name]
            self.at(self.now + proc.latency_s + other.latency_s, self.have_arrives, other, proc, frozenset(proc.held))
        self.schedule(proc)

    def have_arrives(self, proc: Proc, sender: Proc, held: frozenset[int]) -> None:
        if proc.alive and sender.alive and proc.download is not None and sender.name in proc.neighbours:
            proc.download.update_peer(sender.name, held)
            self.schedule(proc)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def simulate(args: argparse.Namespace) -> dict:
    sim = Simulation(args)
    sim.build()
    sim.run()
    survivors = [p for p in sim.procs.values() if p.alive and p.download is not None]
    times = [p.done_at for p in survivors if p.done_at is not None]
    incomplete = len(survivors) - len(times)
    bound = sim.bound_s()
    out = {
        "nodes": args.nodes,
        "size_mib": args.size_mib,
        "chunk_kib": args.chunk_kib,
        "upload_mbit": args.upload_mbit,
        "heterogeneous": args.heterogeneous,
        "latency_ms": args.latency_ms,
        "churn": args.churn,
        "survivors": len(survivors),
        "incomplete": incomplete,
        "bound_s": round(bound, 3),
        "seed_copies": round(sim.procs[SEED].uploaded / (sim.n_chunks * sim.chunk), 2),
        "seed_first_push_s": sim.procs[SEED].first_push_done,
    }
    if times:
        out.update(
            p50_s=round(percentile(times, 0.5), 3),
            p90_s=round(percentile(times, 0.9), 3),
            p100_s=round(max(times), 3) if not incomplete else None,
            p100_over_bound=round(max(times) / bound, 3) if not incomplete else None,
        )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--size-mib", type=float, default=64)
    parser.add_argument("--chunk-kib", type=int, default=512)
    parser.add_argument("--upload-mbit", type=float, default=80, help="seed's (and, homogeneous, every node's) upload")
    parser.add_argument("--heterogeneous", action="store_true", help="log-normal node uploads in [--min-mbit, --max-mbit]")
    parser.add_argument("--min-mbit", type=float, default=5)
    parser.add_argument("--max-mbit", type=float, default=500)
    parser.add_argument("--latency-ms", type=float, default=25, help="one-way latency of each process")
    parser.add_argument("--churn", type=float, default=0.0, help="fraction of nodes that leave (as many join)")
    parser.add_argument("--seed", type=int, default=0)
    defaults = BroadcastConfig()
    parser.add_argument("--upload-slots", type=int, default=defaults.upload_slots)
    parser.add_argument("--upload-queue", type=int, default=defaults.upload_queue)
    parser.add_argument("--per-peer", type=int, default=defaults.scheduler.max_in_flight_per_peer)
    parser.add_argument("--in-flight", type=int, default=defaults.scheduler.max_in_flight)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    result = simulate(args)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:18} {v}")


if __name__ == "__main__":
    main()
