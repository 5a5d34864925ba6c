"""Discrete-event simulation of the weight broadcast, for swarms up to 10,000 nodes.

It drives the real scheduling code (``protocol.broadcast.scheduler``:
``Download`` on every requester, ``UploadPolicy`` on every uploader) over
simulated links; only the network is simulated:

- each process uploads at its own rate, shared by its ``slots`` concurrent
  uploads, and downloads at its own rate, shared by the chunks coming in; a
  chunk moves at the smaller of its two max-min fair shares (as TCP flows
  share links). Admitted requests beyond the slots wait in the engine's
  ``UploadQueue``;
- links are equal (``--upload-mbit``, ``--download-mbit``) or drawn from a mix
  of classes (``--mix``); ``--relay-only`` of the nodes can be reached only
  through a relay: they download at their own rate but upload at most
  ``--relay-mbit`` (the relay's share), with the relay's latency added, and
  their neighbours know it (as the real engine knows a relayed connection);
- every message (request, refusal, Have, the end of a chunk) arrives after the
  sum of the two ends' one-way latencies;
- Have announcements go to every neighbour when a chunk arrives (the seed's:
  when the chunks it offers change);
- each process dials random neighbours up to ``BroadcastConfig.neighbour_limit``
  of its uplink (the seed too) and accepts up to its ``accept_limit``, and has
  as many upload slots as
  ``BroadcastConfig.slots`` gives its uplink;
- churn: ``--churn`` of the nodes leave at random times during the broadcast
  (their uploads stop; requesters notice when the request times out) and as
  many new nodes join at random times, knowing nothing.

Run on its own it simulates the issue's three scenarios at ``--nodes`` and
prints them: equal links (``p100_s`` against ``bound_s``, the
Bar-Noy-Kipnis floor being close to M / u_s), heterogeneous links with
relay-only nodes (``heterogeneous_p100_s`` against ``kumar_ross_s``), and the
latter with churn (``churn_survivors_completed``).
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

from protocol.broadcast.scheduler import Download, SchedulerConfig  # noqa: E402
from protocol.broadcast.settings import BroadcastConfig  # noqa: E402
from protocol.broadcast.uploads import UploadPolicy, UploadQueue  # noqa: E402

SEED = "seed"
# Home links, (share of nodes, upload Mbit/s, download Mbit/s): fibre, cable,
# and DSL or a laptop on hotel Wi-Fi. Uplinks differ by 40x.
DEFAULT_MIX = "0.1:200:1000,0.6:20:100,0.3:5:25"


@dataclass
class Transfer:
    uploader: Proc
    requester: Proc
    idx: int
    remaining: float  # bytes
    rate: float = 0.0  # bytes/s, while active


@dataclass
class Pending:
    """A request sent that has no byte yet."""

    sent: float
    transfer: Transfer | None = None  # waiting in the peer's upload queue, once it got there


@dataclass
class Proc:
    name: str
    upload_Bps: float
    download_Bps: float  # inf: uncapped
    latency_s: float
    download: Download | None
    policy: UploadPolicy
    queue: UploadQueue
    relay_only: bool = False
    neighbours: set[str] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    active: list[Transfer] = field(default_factory=list)
    incoming: list[Transfer] = field(default_factory=list)  # active transfers to this process
    # Requests sent that have no byte yet, by (peer, chunk).
    pending: dict[tuple[str, int], Pending] = field(default_factory=dict)
    last_update: float = 0.0
    epoch: int = 0  # invalidates scheduled completions when rates change
    uploaded: float = 0.0  # bytes
    pushed: set[int] = field(default_factory=set)  # the seed: chunks sent at least once
    first_push_done: float | None = None  # the seed: when every chunk was sent once
    alive: bool = True
    joined_at: float = 0.0
    done_at: float | None = None
    wake_at: float = math.inf


def parse_mix(text: str) -> list[tuple[float, float, float]]:
    """``"0.1:200:1000,0.9:20:100"`` -> [(share, up Mbit/s, down Mbit/s), ...]."""
    classes = []
    for part in text.split(","):
        try:
            share, up, down = (float(x) for x in part.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: expected SHARE:UP_MBIT:DOWN_MBIT") from None
        if share <= 0 or up <= 0 or down <= 0:
            raise argparse.ArgumentTypeError(f"{part!r}: every figure must be positive")
        classes.append((share, up, down))
    total = sum(c[0] for c in classes)
    if abs(total - 1) > 1e-6:
        raise argparse.ArgumentTypeError(f"the shares of {text!r} add up to {total}, not 1")
    return classes


class Simulation:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.seed)
        self.config = BroadcastConfig(
            upload_slots=args.upload_slots,
            upload_queue=args.upload_queue,
            scheduler=SchedulerConfig(max_in_flight_per_peer=args.per_peer, max_in_flight=args.in_flight),
        )
        self.mix = parse_mix(args.mix) if args.mix else None
        self.chunk = args.chunk_kib * 1024
        self.n_chunks = math.ceil(args.size_mib * 1024 / args.chunk_kib)
        self.events: list[tuple[float, int, object, tuple]] = []
        self.seq = 0
        self.now = 0.0
        self.procs: dict[str, Proc] = {}
        self.names: list[str] = []
        self.timeouts = 0  # requests abandoned with no byte (as stalls)

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

    def links(self) -> tuple[float, float, bool]:
        """A new node's (upload, download) in bytes/s and whether it is relay-only."""
        a = self.args
        up, down = a.upload_mbit, a.download_mbit or math.inf
        if self.mix is not None:
            r, acc = self.rng.random(), 0.0
            for share, up, down in self.mix:
                acc += share
                if r < acc:
                    break
        relay_only = self.rng.random() < a.relay_only
        return up * 1e6 / 8, down * 1e6 / 8, relay_only

    def add_proc(self, name: str, *, seed: bool, joined_at: float = 0.0) -> Proc:
        cfg = self.config
        if seed:
            up, down, relay_only = self.args.upload_mbit * 1e6 / 8, math.inf, False
        else:
            up, down, relay_only = self.links()
        latency = self.args.latency_ms / 1000
        if relay_only:
            up = min(up, self.args.relay_mbit * 1e6 / 8)
            latency += self.args.relay_latency_ms / 1000
        proc = Proc(
            name=name,
            upload_Bps=up,
            download_Bps=down,
            latency_s=latency,
            download=None
            if seed
            else Download(
                self.n_chunks,
                set(),
                seed=SEED,
                config=cfg.scheduler,
                rng=random.Random(self.rng.random()),
            ),
            policy=UploadPolicy(self.n_chunks, cfg.admitted(up * 8e-6, seed=seed), seed),
            queue=UploadQueue(cfg.slots(up * 8e-6)),
            relay_only=relay_only,
            held=set(range(self.n_chunks)) if seed else set(),
            joined_at=joined_at,
        )
        self.procs[name] = proc
        self.names.append(name)
        return proc

    def announced(self, proc: Proc) -> frozenset[int]:
        """What ``proc``'s Have names: the seed's offer, a node's chunks."""
        return proc.policy.offered() if proc.download is None else frozenset(proc.held)

    def connect(self, a: Proc, b: Proc) -> None:
        a.neighbours.add(b.name)
        b.neighbours.add(a.name)
        for x, y in ((a, b), (b, a)):
            if x.download is not None:
                if y.relay_only:
                    x.download.relayed.add(y.name)
                if y.held:
                    x.download.update_peer(y.name, self.announced(y))

    def neighbour_limit(self, proc: Proc) -> int:
        return self.config.neighbour_limit(proc.upload_Bps * 8e-6)

    def link_up(self, proc: Proc) -> None:
        """Connect ``proc`` to random live processes until it has enough
        neighbours; each accepts up to its ``accept_limit``."""
        limit = self.neighbour_limit(proc)
        # Random tries rather than a shuffle of everyone: O(limit) per process.
        for _ in range(limit * 8):
            if len(proc.neighbours) >= limit:
                break
            other = self.procs[self.names[self.rng.randrange(len(self.names))]]
            if (
                other is not proc
                and other.alive
                and len(other.neighbours) < self.config.accept_limit(other.upload_Bps * 8e-6)
                and other.name not in proc.neighbours
            ):
                self.connect(proc, other)

    def build(self) -> None:
        seed = self.add_proc(SEED, seed=True)
        nodes = [self.add_proc(f"n{i}", seed=False) for i in range(self.args.nodes)]
        for proc in [seed, *nodes]:
            self.link_up(proc)
        bound = self.bounds()["kumar_ross_s"]
        leavers = self.rng.sample(nodes, int(self.args.churn * len(nodes)))
        for proc in leavers:
            self.at(self.rng.uniform(0, bound), self.leave, proc)
        for i in range(len(leavers)):
            self.at(self.rng.uniform(0, bound), self.join, f"j{i}")
        for proc in nodes:
            self.at(0.0, self.schedule, proc)

    def bounds(self) -> dict[str, float]:
        """``bound_s``: M / u_s, the seed pushing one copy; ``kumar_ross_s``:
        max(M / u_s, M / d_min, N M / (u_s + sum u_i)) over the nodes present
        at the start (relay-only nodes at their relayed upload)."""
        size = self.args.size_mib * 2**20
        seed = self.procs[SEED]
        nodes = [p for p in self.procs.values() if p.download is not None and p.joined_at == 0.0]
        d_min = min(p.download_Bps for p in nodes)
        total_up = seed.upload_Bps + sum(p.upload_Bps for p in nodes)
        return {
            "bound_s": size / seed.upload_Bps,
            "kumar_ross_s": max(size / seed.upload_Bps, size / d_min, len(nodes) * size / total_up),
        }

    # --- churn -------------------------------------------------------------------

    def leave(self, proc: Proc) -> None:
        proc.alive = False
        # Requests in its queue time out as any unanswered request does
        # (check_timeout); chunks on their way stop flowing.
        for transfer in proc.active:
            timeout = transfer.requester.download.request_timeout(proc.name)
            self.at(self.now + timeout, self.failed, transfer.requester.name, proc.name, transfer.idx, "stalled")
        for transfer in proc.active:
            self.detach(transfer)
        proc.active = []
        for transfer in list(proc.incoming):
            # Its downloads end with it; uploaders go on with their other requests.
            up = transfer.uploader
            self.advance(up)
            up.active.remove(transfer)
            up.queue.done()
            self.detach(transfer)
            up.policy.finished(transfer.idx, ok=False, weak=transfer.requester.relay_only)
            self.refill(up)
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
            proc.pending[(peer, idx)] = Pending(self.now)
            self.at(self.now + latency, self.request_arrives, peer, proc.name, idx)
            guessed = not d.durations
            self.at(self.now + d.request_timeout(peer), self.check_timeout, proc, peer, idx, self.now, guessed)
        wake = d.next_wakeup(self.now)
        if wake < proc.wake_at:
            proc.wake_at = wake
            self.at(wake, self.wake, proc)

    def wake(self, proc: Proc) -> None:
        if self.now >= proc.wake_at:
            proc.wake_at = math.inf
            self.schedule(proc)

    def check_timeout(self, proc: Proc, peer: str, idx: int, sent: float, guessed: bool) -> None:
        """A request with no byte after ``request_timeout`` is abandoned as a
        stall, as the engine does: a first guess (sent before any request
        time was measured) is replaced by a measured timeout once there is one."""
        entry = proc.pending.get((peer, idx))
        if not proc.alive or entry is None or entry.sent != sent:
            return
        if guessed and proc.download.durations:
            deadline = sent + proc.download.request_timeout(peer)
            if deadline > self.now:
                self.at(deadline, self.check_timeout, proc, peer, idx, sent, False)
                return
        self.timeouts += 1
        self.cancel(proc, peer, idx)
        self.failed(proc.name, peer, idx, "stalled")

    def cancel(self, proc: Proc, peer: str, idx: int) -> None:
        """``proc`` gives up on a request that has no byte yet. (The engine's
        uploader notices when it reaches the request; here it is dropped at once.)"""
        transfer = proc.pending.pop((peer, idx)).transfer
        if transfer is not None and transfer in transfer.uploader.queue.waiting():
            up = transfer.uploader
            up.queue.remove(transfer)
            up.policy.finished(idx, ok=False, weak=proc.relay_only)

    def failed(self, requester: str, peer: str, idx: int, outcome: str) -> None:
        proc = self.procs[requester]
        if not proc.alive or proc.download is None:
            return
        proc.pending.pop((peer, idx), None)
        proc.download.on_failed(
            peer,
            idx,
            self.now,
            busy=outcome == "busy",
            declined=outcome == "ask_others",
            stalled=outcome == "stalled",
        )
        self.schedule(proc)

    # --- uploading -----------------------------------------------------------------

    def request_arrives(self, uploader_name: str, requester: str, idx: int) -> None:
        uploader, proc = self.procs[uploader_name], self.procs[requester]
        entry = proc.pending.get((uploader_name, idx))
        if not uploader.alive or entry is None:
            # It left while the request was on its way (the request times
            # out), or the requester has given up on it.
            return
        latency = uploader.latency_s + proc.latency_s
        offer = uploader.policy.offered()
        verdict = uploader.policy.allow(idx, requester, weak=proc.relay_only)
        if verdict != "ok":
            self.at(self.now + latency, self.failed, requester, uploader_name, idx, verdict)
            return
        self.announce_offer(uploader, offer)
        # (The engine reads what the requester holds from its latest Have.)
        priority = uploader.policy.priority(requester, shared=len(uploader.held & proc.held))
        entry.transfer = Transfer(uploader, proc, idx, float(self.chunk))
        uploader.queue.push(priority, entry.transfer)
        self.refill(uploader)

    def announce_offer(self, seed: Proc, before: frozenset[int]) -> None:
        """The seed's Have goes out when the chunks it offers change."""
        offer = seed.policy.offered()
        if seed.download is None and offer is not before:
            for name in seed.neighbours:
                other = self.procs[name]
                self.at(self.now + seed.latency_s + other.latency_s, self.have_arrives, other, seed, offer)

    def advance(self, up: Proc) -> None:
        """Account for bytes sent since ``up``'s rates last changed."""
        elapsed = self.now - up.last_update
        if elapsed > 0:
            for t in up.active:
                t.remaining -= elapsed * t.rate
        up.last_update = self.now

    def reschedule(self, up: Proc) -> None:
        """Set ``up``'s transfer rates and schedule its next completion."""
        up.epoch += 1
        if not up.active:
            return
        # Max-min fair at both ends, as TCP flows share links: a chunk its
        # requester's downlink holds back leaves the rest of the uplink to the
        # others, and a downlink gives what slow uploaders leave to fast ones.
        caps = {id(t): self.downlink_share(t) for t in up.active}
        left = up.upload_Bps
        for i, t in enumerate(sorted(up.active, key=lambda t: caps[id(t)])):
            t.rate = min(left / (len(up.active) - i), caps[id(t)])
            left -= t.rate
        first = min(up.active, key=lambda t: max(t.remaining, 0.0) / t.rate)
        eta = max(first.remaining, 0.0) / first.rate
        self.at(self.now + eta, self.upload_done, up, up.epoch, first)

    def downlink_share(self, transfer: Transfer) -> float:
        """``transfer``'s max-min share of its requester's downlink, each
        incoming chunk asking for its uploader's equal share of upload."""
        requester = transfer.requester
        if requester.download_Bps == math.inf:
            return math.inf

        def demand(t: Transfer) -> float:
            return t.uploader.upload_Bps / max(1, len(t.uploader.active))

        left = requester.download_Bps
        flows = sorted(requester.incoming, key=demand)
        for i, t in enumerate(flows):
            share = min(demand(t), left / (len(flows) - i))
            if t is transfer:
                return share
            left -= share
        return left

    def attach(self, transfer: Transfer) -> None:
        """``transfer`` starts: the other chunks coming to its requester slow down."""
        feeding = {t.uploader.name: t.uploader for t in transfer.requester.incoming}
        for up in feeding.values():
            self.advance(up)
        transfer.requester.incoming.append(transfer)
        for up in feeding.values():
            self.reschedule(up)

    def detach(self, transfer: Transfer) -> None:
        """``transfer`` ended: the other chunks coming to its requester speed up."""
        requester = transfer.requester
        requester.incoming.remove(transfer)
        feeding = {t.uploader.name: t.uploader for t in requester.incoming if t.uploader is not transfer.uploader}
        for up in feeding.values():
            self.advance(up)
            self.reschedule(up)

    def refill(self, up: Proc) -> None:
        self.advance(up)
        for transfer in up.queue.pop_ready():
            transfer.requester.pending.pop((up.name, transfer.idx), None)  # its bytes flow
            up.active.append(transfer)
            self.attach(transfer)
        self.reschedule(up)

    def upload_done(self, up: Proc, epoch: int, transfer: Transfer) -> None:
        if epoch != up.epoch or not up.alive:
            return
        self.advance(up)
        up.active.remove(transfer)
        up.queue.done()
        self.detach(transfer)
        offer = up.policy.offered()
        up.policy.finished(transfer.idx, ok=True, weak=transfer.requester.relay_only)
        self.announce_offer(up, offer)
        up.uploaded += self.chunk
        if up.download is None and up.first_push_done is None:
            up.pushed.add(transfer.idx)
            if len(up.pushed) == self.n_chunks:
                up.first_push_done = self.now
        latency = up.latency_s + transfer.requester.latency_s
        self.at(self.now + latency, self.chunk_arrives, transfer.requester.name, up.name, transfer.idx)
        self.refill(up)

    def chunk_arrives(self, requester: str, uploader: str, idx: int) -> None:
        proc = self.procs[requester]
        if not proc.alive or proc.download is None:
            return
        proc.download.on_done(uploader, idx, self.now)
        proc.download.trusted.add(uploader)  # as the engine does
        proc.download.records.served[uploader] += 1
        # An endgame copy that has no byte yet ends as a stall (as the engine's).
        for peer, i in [key for key in proc.pending if key[1] == idx]:
            self.cancel(proc, peer, i)
            self.failed(proc.name, peer, i, "stalled")
        proc.held.add(idx)
        if proc.download.complete and proc.done_at is None:
            proc.done_at = self.now
        held = frozenset(proc.held)
        for name in proc.neighbours:
            other = self.procs[name]
            if other.download is not None and not other.download.complete:
                self.at(self.now + proc.latency_s + other.latency_s, self.have_arrives, other, proc, held)
        self.schedule(proc)

    def have_arrives(self, proc: Proc, sender: Proc, held: frozenset[int]) -> None:
        if proc.alive and sender.alive and proc.download is not None and sender.name in proc.neighbours:
            d = proc.download
            d.update_peer(sender.name, held)
            # (Only a shortcut: with every request slot taken, or nothing new
            # to ask for, next_requests would start nothing now.)
            if len(d.in_flight) + len(d.duplicates) < d.config.max_in_flight and not held <= d.have:
                self.schedule(proc)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def simulate(args: argparse.Namespace) -> dict:
    """One run with ``args``'s links: completion times and bounds."""
    sim = Simulation(args)
    sim.build()
    bounds = sim.bounds()
    sim.run()
    survivors = [p for p in sim.procs.values() if p.alive and p.download is not None]
    times = [p.done_at for p in survivors if p.done_at is not None]
    incomplete = len(survivors) - len(times)
    out = {
        "nodes": args.nodes,
        "size_mib": args.size_mib,
        "chunks": sim.n_chunks,
        "upload_mbit": args.upload_mbit,
        "mix": args.mix or None,
        "relay_only": args.relay_only,
        "latency_ms": args.latency_ms,
        "churn": args.churn,
        "survivors": len(survivors),
        "incomplete": incomplete,
        "bound_s": round(bounds["bound_s"], 3),
        "kumar_ross_s": round(bounds["kumar_ross_s"], 3),
        "seed_copies": round(sim.procs[SEED].uploaded / (sim.n_chunks * sim.chunk), 2),
        "seed_first_push_s": sim.procs[SEED].first_push_done,
        "timeouts": sim.timeouts,
    }
    if times:
        out.update(
            p50_s=round(percentile(times, 0.5), 3),
            p90_s=round(percentile(times, 0.9), 3),
            p100_s=round(max(times), 3) if not incomplete else None,
            p100_over_kumar_ross=round(max(times) / bounds["kumar_ross_s"], 3) if not incomplete else None,
        )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--size-mib", type=float, default=64)
    parser.add_argument("--chunk-kib", type=int, default=256)
    parser.add_argument(
        "--upload-mbit", type=float, default=20, help="the seed's upload, and with equal links every node's"
    )
    parser.add_argument(
        "--download-mbit", type=float, default=0, help="equal links: every node's download (0: uncapped)"
    )
    parser.add_argument(
        "--mix", default="", help=f"heterogeneous node links SHARE:UP_MBIT:DOWN_MBIT,... (e.g. {DEFAULT_MIX})"
    )
    parser.add_argument("--relay-only", type=float, default=0.0, help="share of nodes reachable only through a relay")
    parser.add_argument("--relay-mbit", type=float, default=2.0, help="upload of a relay-only node (its relay's share)")
    parser.add_argument("--relay-latency-ms", type=float, default=25.0, help="one-way latency a relay adds")
    parser.add_argument("--latency-ms", type=float, default=25, help="one-way latency of each process")
    parser.add_argument("--churn", type=float, default=0.0, help="fraction of nodes that leave (as many join)")
    parser.add_argument("--seed", type=int, default=0)
    defaults = BroadcastConfig()
    parser.add_argument("--upload-slots", type=int, default=defaults.upload_slots)
    parser.add_argument("--upload-queue", type=int, default=defaults.upload_queue)
    parser.add_argument("--per-peer", type=int, default=defaults.scheduler.max_in_flight_per_peer)
    parser.add_argument("--in-flight", type=int, default=defaults.scheduler.max_in_flight)
    parser.add_argument("--only", action="store_true", help="simulate these links once, instead of the three scenarios")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.mix:
        try:
            parse_mix(args.mix)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--mix: {exc}")
    if not 0 <= args.relay_only <= 1 or not 0 <= args.churn < 1:
        parser.error("--relay-only and --churn are fractions")
    return args


def scenarios(args: argparse.Namespace) -> dict:
    """Equal links; the default mix with 30 % relay-only nodes; that with 10 % churn."""
    equal = simulate(argparse.Namespace(**{**vars(args), "mix": "", "relay_only": 0.0, "churn": 0.0}))
    mixed = argparse.Namespace(**{**vars(args), "mix": args.mix or DEFAULT_MIX, "relay_only": args.relay_only or 0.3})
    heterogeneous = simulate(argparse.Namespace(**{**vars(mixed), "churn": 0.0}))
    churn = simulate(argparse.Namespace(**{**vars(mixed), "churn": args.churn or 0.1}))
    return {
        "nodes": args.nodes,
        "chunks": equal["chunks"],
        "p100_s": equal["p100_s"],
        "bound_s": equal["bound_s"],
        "p100_over_bound": round(equal["p100_s"] / equal["bound_s"], 3) if equal["p100_s"] else None,
        "heterogeneous_p100_s": heterogeneous["p100_s"],
        "kumar_ross_s": heterogeneous["kumar_ross_s"],
        "heterogeneous_over_kumar_ross": heterogeneous["p100_over_kumar_ross"],
        "churn_survivors_completed": churn["incomplete"] == 0,
        "churn_p100_over_kumar_ross": churn["p100_over_kumar_ross"],
        "runs": {"equal": equal, "heterogeneous": heterogeneous, "churn": churn},
    }


def main() -> None:
    args = parse_args()
    result = simulate(args) if args.only else scenarios(args)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:28} {v}")


if __name__ == "__main__":
    main()
