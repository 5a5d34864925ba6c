"""One emulator process of bench/swarm_load.py: a crowd of volunteer identities.

The process runs one real node (``echo_node.node.Node`` with the torch
backend), the *leader*: it joins through the bootstrap peer, finds the learner
and follows its versions through the broadcast, as ``echo-node join`` does,
but asks for no work of its own. Beside it run ``--count`` light identities,
each a real libp2p peer (its own Ed25519 key, its own Noise + yamux host
listening on its own 127.0.X.Y address) connected directly to the learner.
Each does what a node does at the protocol level:

- asks for work (``WorkRequest``), honouring ``NoWork.retry_after_ms`` and
  backing off after an ``ErrorReply`` or a failed request;
- generates real rollouts with the leader's backend and weights (under the
  leader's ``weights.in_use``, declaring the version the leader holds, so
  they pass the learner's log-prob check; assignments of several identities
  that wait at once share one generate call, ``Generator``), then waits out
  its emulated generation time (a laptop or a GPU node, ``--laptop-share``);
- signs the batch with its own key, submits it, checks the receipt;
- fetches its receipts now and then (``--receipts-every-s``) and, at the end,
  checks that every receipt that said "accepted" is among them;
- keeps one have-stream to the learner, sending a ``Have`` (the leader's)
  whenever the leader's version changes, if the learner accepts the stream.

Controlled by signals from bench/swarm_load.py: SIGUSR1 opens the measurement
window, SIGUSR2 ends it (stop asking for work, deliver what is under way,
fetch receipts, print the result, exit); SIGINT or SIGTERM exits at once.
Prints JSON lines on stdout: ``joined``, ``stats`` every second (identities
started, connected and stuck), ``result`` at the end.

    python bench/load_identities.py --bootstrap ADDR --learner ADDR/p2p/ID \\
        --job-id JOB --count 250 --data-dir DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from libp2p.peer.peerinfo import PeerInfo  # noqa: E402

from echo_node import receipts  # noqa: E402
from echo_node.backend import Sample  # noqa: E402
from echo_node.backend_torch import TorchBackend  # noqa: E402
from echo_node.config import NodeConfig  # noqa: E402
from echo_node.guard import check_assignment  # noqa: E402
from echo_node.node import Node  # noqa: E402
from echo_node.refusals import Refused  # noqa: E402
from protocol.broadcast.following import VersionTooLarge  # noqa: E402
from protocol.broadcast.state import PEER_ERRORS  # noqa: E402
from protocol.errors import ProtocolError  # noqa: E402
from protocol.identity import Identity  # noqa: E402
from protocol.messages import UNSIGNED, ErrorReply  # noqa: E402
from protocol.net.host import make_host, parse_multiaddr, parse_peer_addr  # noqa: E402
from protocol.net.swarm import Swarm  # noqa: E402
from protocol.process import logs, malloc  # noqa: E402
from protocol.process.gc_pauses import GcPauses, freeze_heap  # noqa: E402
from protocol.rpc import KEPT_REUSE_S, KeptStreams, RequestFailed, request  # noqa: E402
from protocol.wire import have, rollout, work  # noqa: E402
from protocol.wire.rollout import Completion, Receipt, RolloutBatch, RolloutGroup  # noqa: E402
from protocol.wire.work import NoWork, WorkAssignment, WorkRequest  # noqa: E402

log = logging.getLogger("bench.load_identities")

# Deadlines and pauses, as a node's defaults (echo_node/config.py).
WORK_TIMEOUT_S = 30.0  # the learner holds a work request up to its long poll (10 s)
SUBMIT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
RETRY_S = 1.0  # first pause after a failure, doubling up to MAX_RETRY_S
MAX_RETRY_S = 30.0
MAX_DELIVERIES = 4  # batches on their way to the learner at once, per identity
# How long the end may take: deliveries under way (each bounded by
# SUBMIT_TIMEOUT_S) and a last receipts fetch per identity.
FINISH_TIMEOUT_S = 120.0
# 250 identities per third octet: 127.0.X.1-250 (127.0.0.0/8 is all loopback on Linux).
PER_OCTET = 250


@dataclass(frozen=True)
class Mix:
    """Emulated generation time per assignment: a share of laptops, the rest GPU nodes."""

    laptop_share: float
    laptop_s: tuple[float, float]
    gpu_s: tuple[float, float]

    def draw_class(self, rng: random.Random) -> tuple[float, float]:
        return self.laptop_s if rng.random() < self.laptop_share else self.gpu_s


@dataclass
class Tally:
    """What the process's identities saw, counted and timed."""

    counts: Counter[str] = field(default_factory=Counter)
    # Client-side latencies (ms) inside the measurement window, by kind:
    # work requests answered with an assignment or an error, long polls that
    # ended in NoWork, rollout submissions (to the receipt), receipt fetches,
    # and the event loop's lateness.
    latencies: dict[str, list[int]] = field(
        default_factory=lambda: {"work": [], "no_work": [], "submit": [], "receipts": [], "loop_lag": []}
    )
    measuring: bool = False
    window_start: Counter[str] = field(default_factory=Counter)
    window_end: Counter[str] | None = None  # the counts when the window closed
    cpu_start_s: float = 0.0
    cpu_end_s: float = 0.0
    # Python's cyclic collector inside the window: its passes stop this
    # process's event loop, so they show as loop lag.
    collector: GcPauses = field(default_factory=lambda: GcPauses().start())

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] += n

    def failed(self, what: str, exc: RequestFailed) -> None:
        """A request that got no answer, counted by what ended it (logged the first time)."""
        key = f"{what}:{failure_kind(exc)}"
        if not self.counts[key]:
            log.warning("%s: %s", key, exc)
        self.count(key)

    def timed(self, kind: str, since: float) -> None:
        if self.measuring:
            self.latencies[kind].append(round((trio.current_time() - since) * 1000))

    def lag(self, due: float) -> None:
        """How late (ms) a sleep due at ``due`` woke."""
        if self.measuring:
            self.latencies["loop_lag"].append(round((trio.current_time() - due) * 1000))

    def open_window(self) -> None:
        self.measuring = True
        self.window_start = Counter(self.counts)
        self.collector.reset()
        for samples in self.latencies.values():
            samples.clear()
        self.cpu_start_s = time.process_time()

    def close_window(self) -> None:
        if self.measuring:
            self.measuring = False
            self.cpu_end_s = time.process_time()
            self.window_end = Counter(self.counts)
            self.collector.stop()

    def window(self) -> dict[str, int]:
        """What was counted inside the window (not the finish after it)."""
        end = self.counts if self.window_end is None else self.window_end
        return {k: v - self.window_start[k] for k, v in end.items() if v - self.window_start[k]}


def failure_kind(exc: RequestFailed) -> str:
    """``timeout`` (no answer in time) or the error that ended the request."""
    return type(exc.__cause__).__name__ if exc.__cause__ is not None else "timeout"


def backoff_s(failures: int) -> float:
    return min(RETRY_S * 2 ** min(failures - 1, 10), MAX_RETRY_S)


@asynccontextmanager
async def following(node: Node) -> AsyncIterator[None]:
    """``Node.run`` up to its work stages: join, find the learner, follow its
    versions through the broadcast (and load the first), until the block ends.
    Not ``Node.run`` itself: its work stages would add one node generating as
    fast as the backend goes to the load, at no pace of the mix."""
    async with node.following():
        assert node.weights is not None
        await node.weights.update(0)
        yield


class Generator:
    """The process's one backend, shared by its identities. Assignments that
    wait at the same moment go through it in one generate call, as one node
    batches the prompts of its own assignment: on the tiny model a call's
    fixed cost outweighs its prompts, and one call per assignment would
    leave the emulators' core, not the learner's, the limit. Each call runs
    under the leader's ``weights.in_use`` and reports the version it used."""

    def __init__(self, leader: Node, max_prompts: int):
        self.leader = leader
        self.max_prompts = max_prompts
        self._waiting: list[_Pending] = []
        self._arrived = trio.Event()

    async def generate(self, assignment: WorkAssignment) -> tuple[int, list[list[Sample]]]:
        """The assignment's groups and the version that generated them."""
        pending = _Pending(assignment)
        self._waiting.append(pending)
        self._arrived.set()
        await pending.done.wait()
        return pending.version, pending.samples

    async def run(self) -> None:
        weights, backend = self.leader.weights, self.leader.backend
        assert weights is not None and backend is not None
        while True:
            await self._arrived.wait()
            self._arrived = trio.Event()
            while self._waiting:
                calls = self._take()
                first = calls[0].assignment
                prompts = [p.tokens for c in calls for p in c.assignment.prompts]
                async with weights.in_use:
                    version = weights.version
                    samples = await trio.to_thread.run_sync(
                        backend.generate,
                        prompts,
                        first.group_size,
                        first.max_new_tokens,
                        first.temperature,
                        first.stop_token_ids,
                    )
                for c in calls:
                    c.version, c.samples = version, samples[: len(c.assignment.prompts)]
                    samples = samples[len(c.assignment.prompts) :]
                    c.done.set()

    def _take(self) -> list[_Pending]:
        """The oldest waiting assignment and those that can share its call
        (same sampling settings), up to ``max_prompts`` prompts."""
        key = self._waiting[0].key
        taken, left, prompts = [], [], 0
        for pending in self._waiting:
            n = len(pending.assignment.prompts)
            if pending.key == key and (not taken or prompts + n <= self.max_prompts):
                taken.append(pending)
                prompts += n
            else:
                left.append(pending)
        self._waiting = left
        return taken


@dataclass
class _Pending:
    assignment: WorkAssignment
    done: trio.Event = field(default_factory=trio.Event)
    version: int = -1
    samples: list[list[Sample]] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        a = self.assignment
        return (a.group_size, a.max_new_tokens, a.temperature, a.stop_token_ids)


class Crowd:
    """The leader and its light identities, in this process."""

    def __init__(self, args: argparse.Namespace, leader: Node):
        self.args = args
        self.leader = leader
        self.learner = parse_peer_addr(args.learner)
        self.learner_id = self.learner.peer_id.to_base58()
        self.job_id = args.job_id
        self.mix = Mix(args.laptop_share, tuple(args.laptop_s), tuple(args.gpu_s))
        self.rng = random.Random(args.seed)
        self.tally = Tally()
        self.generator = Generator(leader, args.generate_prompts)
        self.volunteers: list[Volunteer] = []
        self.finishing = trio.Event()
        self.version_changed = trio.Event()  # set (and replaced) when the leader loads a version

    @property
    def version(self) -> int:
        return self.leader.version

    async def run(self) -> None:
        """Start the identities at the ramp's rate, run until SIGUSR2, then report."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._report_stats)
            nursery.start_soon(self._watch_version)
            nursery.start_soon(self.generator.run)
            async with trio.open_nursery() as identities:
                for i in range(self.args.count):
                    if self.finishing.is_set():
                        break
                    volunteer = Volunteer(self, self.args.first + i)
                    self.volunteers.append(volunteer)
                    identities.start_soon(volunteer.run)
                    # Spread the Noise handshakes: the learner does each on its one core.
                    await trio.sleep(1 / self.args.ramp_per_s)
                emit("ramped", started=len(self.volunteers))
                keep_heap()
                await self.finishing.wait()
                identities.cancel_scope.deadline = trio.current_time() + FINISH_TIMEOUT_S
            self.tally.close_window()
            self._print_result()
            nursery.cancel_scope.cancel()

    def on_signal(self, signum: int) -> None:
        if signum == signal.SIGUSR1:
            keep_heap()
            self._count_streams()
            self.tally.open_window()
        elif signum == signal.SIGUSR2:
            self._count_streams()
            self.tally.close_window()
            self.finishing.set()
            for volunteer in self.volunteers:
                volunteer.working.cancel()

    def _count_streams(self) -> None:
        """Streams the identities opened to the learner and exchanges they had
        on kept ones, so far: a new stream costs the learner a negotiation."""
        kept = [v.streams for v in self.volunteers if v.streams is not None]
        self.tally.counts["streams_opened"] = sum(k.opened for k in kept)
        self.tally.counts["streams_reused"] = sum(k.reused for k in kept)

    async def _watch_version(self) -> None:
        """Wake the have-writers when the leader has loaded another version."""
        held = self.version
        while True:
            await trio.sleep(0.2)
            if self.version != held:
                held = self.version
                self.version_changed.set()
                self.version_changed = trio.Event()

    async def _report_stats(self) -> None:
        """Every second: identities started, connected and stuck (a connection
        the learner dropped counts as lost). Also how late this process's
        event loop wakes: a saturated emulator inflates every latency it measures."""
        was_connected: set[int] = set()
        while True:
            connected = {v.index for v in self.volunteers if v.connected()}
            self.tally.count("connection_lost", len(was_connected - connected))
            was_connected = connected
            emit(
                "stats",
                started=len(self.volunteers),
                connected=len(connected),
                stuck=sum(v.stuck() for v in self.volunteers),
                version=self.version,
                accepted=self.tally.counts["accepted"],
            )
            woke = trio.current_time() + 1.0
            await trio.sleep_until(woke)
            self.tally.lag(woke)

    def _print_result(self) -> None:
        t = self.tally
        emit(
            "result",
            identities=len(self.volunteers),
            connected=sum(v.connected() for v in self.volunteers),
            stuck=sum(v.stuck() for v in self.volunteers),
            window=t.window(),
            total=dict(t.counts),
            latencies_ms=t.latencies,
            cpu_s=round(t.cpu_end_s - t.cpu_start_s, 3),
            **t.collector.to_json(),
            # Every receipt that said accepted, by identity: bench/swarm_load.py
            # looks each up in the learner's ledger.
            accepted={v.me: sorted(h.hex() for h in v.accepted) for v in self.volunteers if v.accepted},
        )


class Volunteer:
    """One light identity: a libp2p host of its own, working at its class's pace."""

    def __init__(self, crowd: Crowd, index: int):
        self.crowd = crowd
        self.index = index
        self.identity = Identity.generate()
        self.me = self.identity.peer_id_str
        self.listen = f"/ip4/127.0.{1 + index // PER_OCTET}.{1 + index % PER_OCTET}/tcp/0"
        self.pace_s = crowd.mix.draw_class(crowd.rng)
        self.rng = random.Random(crowd.rng.random())
        self.host: Any = None
        self.streams: KeptStreams | None = None  # to the learner, unless --one-stream-each
        self.working = trio.CancelScope()  # cancelled when the window ends: no new work
        self.accepted: set[bytes] = set()  # batch hashes of receipts that said accepted
        self.tokens_per_s = 0.0

    def connected(self) -> bool:
        return any(not c.is_closed for c in self._connections())

    def stuck(self) -> bool:
        """Only closed connections to the learner, which py-libp2p 0.8.1 keeps
        listing: every request then fails ("No valid connections available")
        without dialling again, as a node's would."""
        connections = self._connections()
        return bool(connections) and all(c.is_closed for c in connections)

    def _connections(self) -> list:
        return self.host.get_network().get_connections(self.crowd.learner.peer_id) if self.host else []

    async def _request(self, protocols: tuple[str, ...], talk: Any, timeout_s: float) -> Any:
        """One exchange with the learner: on a kept stream, as a node's, or
        with --one-stream-each on a stream of the older version of its own."""
        learner = self.crowd.learner.peer_id
        if self.streams is None:
            return await request(self.host, learner, protocols[-1], talk, timeout_s=timeout_s)
        return await self.streams.request(learner, protocols, talk, timeout_s=timeout_s)

    async def run(self) -> None:
        tally = self.crowd.tally
        self.host = make_host(self.identity, [self.listen])
        if not self.crowd.args.one_stream_each:
            self.streams = KeptStreams(self.host, idle_s=KEPT_REUSE_S)
        async with self.host.run([parse_multiaddr(self.listen)]):
            async with trio.open_nursery() as side:
                # Deliveries outlive the work loop: the window's end stops the
                # asking, and what was generated is still delivered.
                async with trio.open_nursery() as deliveries:
                    with self.working:
                        await self._connect()
                        side.start_soon(self._keep_have_stream)
                        side.start_soon(self._fetch_receipts_now_and_then)
                        await self._work(deliveries)
                side.cancel_scope.cancel()
            if not self.accepted:
                return
            # Every receipt that said accepted must be among those the learner gives back.
            try:
                held = await self._fetch_receipts()
            except PEER_ERRORS:
                tally.count("final_receipts_failed")
                return
            fetched = {r.batch_hash for r in held if r.verdict == "accepted"}
            tally.count("accepted_missing_from_fetch", len(self.accepted - fetched))

    async def _connect(self) -> None:
        """Dial the learner until it answers (backing off), as a node retries a lost learner."""
        learner, failures = self.crowd.learner, 0
        while True:
            try:
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    await self.host.connect(PeerInfo(learner.peer_id, learner.addrs))
                self.crowd.tally.count("connected")
                return
            except (trio.TooSlowError, *PEER_ERRORS) as exc:
                failures += 1
                self.crowd.tally.count("connect_failed")
                if failures == 1:
                    log.warning("could not connect to the learner: %s: %s", type(exc).__name__, exc)
                await trio.sleep(backoff_s(failures))

    async def _work(self, deliveries: trio.Nursery) -> None:
        tally = self.crowd.tally
        in_flight = trio.Semaphore(MAX_DELIVERIES)
        failures = 0
        while True:
            asked = trio.current_time()
            try:
                reply = await self._request(
                    work.PROTOCOLS, lambda stream: work.ask(stream, self._ask()), WORK_TIMEOUT_S
                )
            except RequestFailed as exc:
                tally.failed("work_failed", exc)
                failures += 1
                await trio.sleep(backoff_s(failures))
                continue
            if isinstance(reply, NoWork):
                tally.timed("no_work", asked)
                tally.count("no_work")
                await trio.sleep(reply.retry_after_ms / 1000)
                continue
            tally.timed("work", asked)
            if isinstance(reply, ErrorReply):
                tally.count(f"work_error:{reply.code}")
                failures += 1
                await trio.sleep(backoff_s(failures))
                continue
            failures = 0
            tally.count("assignments")
            batch = await self._roll_out(reply, asked)
            if batch is not None:
                await in_flight.acquire()
                deliveries.start_soon(self._deliver, batch, in_flight)
            await trio.sleep(self.crowd.args.rest_s)  # the crowd's offered load (swarm_load --offered)

    def _ask(self) -> WorkRequest:
        backend = self.crowd.leader.backend
        assert backend is not None
        return WorkRequest(
            job_id=self.crowd.job_id,
            max_prompts=64,  # a node's --max-prompts default: the learner sizes the answer
            held_version=self.crowd.version,
            backend=backend.name,
            dtype=backend.dtype,
            name=f"load{self.index}",
            reachability="public",
            device=backend.device.kind,
            memory_mib=0,  # free memory unknown
            tokens_per_s=round(self.tokens_per_s, 1),
        )

    async def _roll_out(self, assignment: WorkAssignment, started: float) -> RolloutBatch | None:
        """Real rollouts with the leader's weights, then the rest of this
        identity's emulated generation time; None if the assignment is dropped."""
        crowd, tally = self.crowd, self.crowd.tally
        leader = crowd.leader
        weights, backend = leader.weights, leader.backend
        assert weights is not None and backend is not None
        weights.named(assignment.version)  # the leader fetches it in the background, as a node does
        try:
            while weights.version < assignment.min_version:
                await weights.update(assignment.version)
            assert weights.limits is not None
            check_assignment(assignment, weights.limits)
        except (Refused, VersionTooLarge, RequestFailed, ProtocolError) as exc:
            tally.count("dropped_assignment")
            log.warning("dropping an assignment: %s", exc)
            return None
        # The batch declares the version that really generated it.
        version, samples = await crowd.generator.generate(assignment)
        tokens = sum(len(s.tokens) for group in samples for s in group)
        # The emulated generation time: pacing, as --emulate-tokens-per-s does for a node.
        await trio.sleep_until(started + self.rng.uniform(*self.pace_s))
        seconds = trio.current_time() - started
        rate = tokens / max(seconds, 1e-6)
        self.tokens_per_s = rate if not self.tokens_per_s else 0.7 * self.tokens_per_s + 0.3 * rate
        return self.identity.sign(
            RolloutBatch(
                job_id=assignment.job_id,
                version=version,
                peer_id=self.me,
                nonce=os.urandom(16),
                backend=backend.name,
                dtype=backend.dtype,
                device=backend.device.kind,
                generate_ms=int(seconds * 1000),
                groups=tuple(
                    RolloutGroup(p.prompt_id, tuple(Completion(s.tokens, s.logprobs) for s in group))
                    for p, group in zip(assignment.prompts, samples)
                ),
                signature=UNSIGNED,
            )
        )

    async def _deliver(self, batch: RolloutBatch, in_flight: trio.Semaphore) -> None:
        crowd, tally = self.crowd, self.crowd.tally
        sent = trio.current_time()
        try:
            reply = await self._request(
                rollout.PROTOCOLS, lambda stream: rollout.submit(stream, batch), SUBMIT_TIMEOUT_S
            )
            if isinstance(reply, ErrorReply):
                tally.count(f"rollout_error:{reply.code}")
                return
            receipts.check_receipt(batch, reply, crowd.learner_id, self.me, crowd.job_id)
        except RequestFailed as exc:
            tally.failed("submit_failed", exc)
            return
        finally:
            in_flight.release()
        tally.timed("submit", sent)
        if reply.verdict == "accepted":
            self.accepted.add(reply.batch_hash)
            tally.count("accepted")
            tally.count("accepted_tokens", reply.tokens)
        else:
            tally.count(f"refused:{reply.reason}")

    async def _fetch_receipts(self) -> list[Receipt]:
        # receipts.fetch_all reads only swarm.host: a light identity runs no DHT.
        swarm = Swarm(self.host, dht=None)  # type: ignore[arg-type]
        return await receipts.fetch_all(
            swarm, self.crowd.learner.peer_id, self.me, self.crowd.job_id, timeout_s=SUBMIT_TIMEOUT_S
        )

    async def _fetch_receipts_now_and_then(self) -> None:
        tally, every_s = self.crowd.tally, self.crowd.args.receipts_every_s
        if every_s <= 0:
            return
        await trio.sleep(self.rng.uniform(0, every_s))  # identities fetch out of step
        while True:
            asked = trio.current_time()
            try:
                await self._fetch_receipts()
                tally.timed("receipts", asked)
                tally.count("receipts_fetched")
            except RequestFailed as exc:
                tally.failed("receipts_failed", exc)
            await trio.sleep(every_s)

    async def _keep_have_stream(self) -> None:
        """One have-stream to the learner, as a broadcast neighbour keeps: the
        leader's ``Have`` whenever the leader's version changes, the learner's
        read continuously (yamux resets a stream whose reader stalls for 5 s).
        The learner accepts a bounded number of neighbours and closes the rest
        at once: such a stream ends before its first ``Have``."""
        crowd, tally = self.crowd, self.crowd.tally
        engine = crowd.leader.engine
        assert engine is not None
        try:
            stream = await self.host.new_stream(crowd.learner.peer_id, [have.PROTOCOL])
        except PEER_ERRORS:
            tally.count("have_open_failed")
            return
        received = 0

        async def read() -> None:
            nonlocal received
            while True:
                await have.receive(stream)
                received += 1

        async def write() -> None:
            while True:
                changed = crowd.version_changed
                # What the leader announces, as a node holding its weights would.
                await have.send(stream, engine._my_have())
                tally.count("have_sent")
                await changed.wait()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                await read()
        except* PEER_ERRORS:  # the learner closed or reset it
            tally.count("have_refused" if received == 0 else "have_ended")
        finally:
            with trio.move_on_after(1):
                try:
                    await stream.close()
                except PEER_ERRORS:
                    pass  # already reset by the learner


def keep_heap() -> None:
    """Hide what is alive now from the cyclic collector: the identities'
    hosts, connections and streams live until the process ends, and a full
    pass over them stopped this process's event loop for up to 1.5 s at 250
    identities (``gc_max_ms``), which the learner saw as timeouts and lost
    connections. What is allocated later is still collected, its youngest
    generation as seldom as the learner's (``--gc-young``'s default)."""
    freeze_heap()


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"event": kind, "t": round(time.time(), 3), **fields}), flush=True)


async def main(args: argparse.Namespace) -> None:
    backend = TorchBackend(threads=1)
    config = NodeConfig(
        bootstrap=[args.bootstrap],
        listen=["/ip4/127.0.0.1/tcp/0"],
        data_dir=args.data_dir,
        name=f"load-leader{args.first}",
        mdns=False,
        upnp=False,
    )
    leader = Node(config, Identity.generate(), backend)
    async with following(leader):
        assert leader.job_id == args.job_id, (leader.job_id, args.job_id)
        emit("joined", leader=leader.me, version=leader.version)
        crowd = Crowd(args, leader)
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
                    async for signum in signals:
                        crowd.on_signal(signum)

            nursery.start_soon(watch_signals)
            await crowd.run()
            nursery.cancel_scope.cancel()
    backend.close()


def parse_range(text: str) -> tuple[float, float]:
    lo, hi = (float(x) for x in text.split(","))
    return lo, hi


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="bootstrap peer multiaddr (with /p2p/)")
    parser.add_argument("--learner", required=True, help="the learner's multiaddr (with /p2p/)")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--count", type=int, required=True, help="light identities in this process")
    parser.add_argument("--first", type=int, default=0, help="index of the first (picks its loopback address)")
    parser.add_argument("--ramp-per-s", type=float, default=12.5, help="identities started per second")
    parser.add_argument("--laptop-share", type=float, default=0.7)
    parser.add_argument("--laptop-s", type=parse_range, default=(10.0, 30.0), help="LO,HI seconds per assignment")
    parser.add_argument("--gpu-s", type=parse_range, default=(2.0, 5.0), help="LO,HI seconds per assignment")
    parser.add_argument(
        "--generate-prompts", type=int, default=32, help="most prompts in one generate call (of several identities)"
    )
    parser.add_argument("--receipts-every-s", type=float, default=120.0, help="0: only at the end")
    parser.add_argument("--rest-s", type=float, default=0.0, help="seconds each identity rests after an assignment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--one-stream-each",
        action="store_true",
        help="a new stream per work request and per batch (the protocols' older versions), not kept streams",
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="the leader node's data dir")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    logs.setup(arguments.verbose)
    # protocol.process.logs passes only our packages' records; this one is the bench's.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.propagate = False
    malloc.limit_arenas()
    from protocol.process.runtime import run_until_signal

    run_until_signal(lambda: main(arguments))
