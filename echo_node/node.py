"""The volunteer node: find a job, keep the current weights, roll out, submit.

``run`` reads top to bottom: join the swarm, find a learner through the DHT,
check that its model fits this machine, fetch the current weights, then run
three stages as a pipeline, so the backend never waits on the
network: ask for work (if the version we hold is older than the assignment
allows, fetch the one it names; else keep working and fetch it in the
background) -> generate (in a worker thread) and sign -> deliver the batch and
check the signed receipt. A learner that does not answer is asked again after
a pause (``echo_node.asking``); beside the stages, ``echo_node.reachability``
keeps this node dialable. Ctrl-C cancels them and the host closes its connections.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID

from echo_node import job_memory, receipts, status
from echo_node.asking import ask_once, keep_asking
from echo_node.backend import Backend, generate_in_calls
from echo_node.config import NodeConfig
from echo_node.guard import check_assignment
from echo_node.jobs import check_model
from echo_node.learner_lookup import NoLearnerFound, find_learner, relocate_learner
from echo_node.memory import GiB, free_bytes, prompts_per_call
from echo_node.reachability import ReachabilityWatch
from echo_node.refusals import Refused
from echo_node.weights import Weights
from protocol.broadcast.engine import BroadcastConfig, BroadcastEngine
from protocol.broadcast.following import VersionTooLarge
from protocol.broadcast.store import VersionStore
from protocol.errors import ProtocolError
from protocol.identity import Identity
from protocol.messages import UNSIGNED, ErrorReply, Manifest
from protocol.net.lan import discover_lan
from protocol.net.reachability import Reachability
from protocol.net.swarm import Swarm, connect_bootstrap, open_swarm
from protocol.process.logs import event
from protocol.rpc import KEPT_REUSE_S, KeptStreams, RequestFailed
from protocol.wire import rollout
from protocol.wire.rollout import Completion, Receipt, RolloutBatch, RolloutGroup
from protocol.wire.work import WorkAssignment, WorkRequest

log = logging.getLogger(__name__)


class Node:
    def __init__(
        self,
        config: NodeConfig,
        identity: Identity,
        backend: Backend | None = None,
        learner_addrs: tuple[str, ...] = (),
        swarm: Swarm | None = None,
    ):
        """``backend`` may be None for a node that only queries (``echo-node credits``).
        ``learner_addrs``: where the learner was last seen (an invite says), tried first.
        ``swarm``: one already joined (the doctor's), else ``run`` joins one."""
        self.config = config
        self.identity = identity
        self.me = identity.peer_id_str
        self.backend = backend
        self.learner_addrs = learner_addrs
        self._worked_for = job_memory.recall(config.job_path)  # what job.json says
        self.reachability_watch = ReachabilityWatch(config)
        self.swarm = swarm
        self.streams: KeptStreams | None = None  # to the learner: work requests and batches
        self.engine: BroadcastEngine | None = None
        self.learner: ID | None = None
        self._learner_at: tuple[multiaddr.Multiaddr, ...] = ()  # where it answered last
        self.record: Manifest | None = None  # the learner's DHT record, as found
        self.job_id = ""
        self.rollouts_sent = 0
        self.receipts_accepted = 0
        self._outbox: trio.MemorySendChannel[RolloutBatch] | None = None
        self._generate_s = 0.0  # how long the last assignment took to generate
        self.tokens_per_s = 0.0  # generation throughput, a running mean (shown to the learner)
        self._max_memory = int(config.max_memory * GiB)
        self.weights = Weights(backend, config, self._free) if backend is not None else None

    @property
    def version(self) -> int:
        """The policy version this node generates with (-1: none yet)."""
        return self.weights.version if self.weights is not None else -1

    @property
    def reachability(self) -> Reachability:
        """Whether other peers can dial this node, as last checked."""
        return self.reachability_watch.current

    @asynccontextmanager
    async def joined(self, *, keep_waiting: bool = True) -> AsyncIterator[Swarm]:
        """Join the swarm through the bootstrap peers and find a learner
        (``find_learner``: ``keep_waiting`` for the one of the job it worked for)."""
        cfg = self.config
        # DHT server mode: py-libp2p 0.8.1 adds every peer that queries it to
        # its routing table and then fails to query client-mode peers back.
        async with (
            open_swarm(
                self.identity,
                cfg.listen,
                server=True,
                relay_hop=cfg.relay,
                relays=cfg.bootstrap,
                upnp=cfg.upnp,
                connections=cfg,
            ) as swarm,
            trio.open_nursery() as nursery,
        ):
            self.swarm = swarm
            self.streams = KeptStreams(swarm.host, idle_s=KEPT_REUSE_S)
            if cfg.mdns:
                await nursery.start(discover_lan, swarm, cfg.bootstrap_timeout_s)
            await connect_bootstrap(swarm, cfg.bootstrap, cfg.bootstrap_timeout_s)
            await self.find_learner(keep_waiting=keep_waiting)
            try:
                yield swarm
            finally:
                nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def following(self) -> AsyncIterator[Swarm]:
        """Joined, with the learner's versions followed through the broadcast
        (``Weights.follow``) until the block ends."""
        cfg = self.config
        async with self.joined() as swarm, trio.open_nursery() as nursery:
            assert self.learner is not None and self.record is not None and self.weights is not None
            assert self.backend is not None
            learner_id = self.learner.to_base58()
            self.weights.fit_job(self.record.model_config)
            store = VersionStore(cfg.weights_dir(self.job_id), learner_id=learner_id, keep=cfg.keep_versions)
            self.engine = BroadcastEngine(
                swarm,
                store,
                job_id=self.job_id,
                learner_id=learner_id,
                is_seed=False,
                config=BroadcastConfig(
                    max_upload_mbit=cfg.max_upload_mbit,
                    max_peers=cfg.max_peers,
                    max_version_bytes=int(cfg.max_disk_gb * 2**30 / (cfg.keep_versions + 1)),
                ),
                variant=self.backend.variant,
            )
            await nursery.start(self.engine.run)
            self.weights.join(self.engine, learner_id)
            nursery.start_soon(self.weights.follow)
            try:
                yield swarm
            finally:
                nursery.cancel_scope.cancel()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Work until cancelled. Reports the learner's peer id when joined."""
        cfg = self.config
        async with self.following() as swarm, trio.open_nursery() as nursery:
            assert self.learner is not None
            assert swarm.relay is not None
            await nursery.start(swarm.relay.run)
            nursery.start_soon(self.reachability_watch.run, swarm, self.learner)
            nursery.start_soon(status.keep_written, self, cfg.status_path)
            # Three stages, each its own task, so the backend never waits on the
            # network: fetch work -> generate and sign -> deliver. The generator
            # asks for each assignment (early, while it still generates, when
            # it is fast); at most --max-deliveries batches are on their way.
            wants_in, wants_out = trio.open_memory_channel[None](1)
            work_in, work_out = trio.open_memory_channel[WorkAssignment](0)
            self._outbox, batches_out = trio.open_memory_channel[RolloutBatch](0)
            nursery.start_soon(self._generate, work_out, wants_in)
            nursery.start_soon(self._deliver_all, batches_out)
            task_status.started((self.learner, self.job_id))
            await keep_asking(wants_out, work_in, ask=self.request_work, relocate=self._relocate, config=cfg)

    async def _generate(
        self, assignments: trio.MemoryReceiveChannel[WorkAssignment], wants: trio.MemorySendChannel[None]
    ) -> None:
        await wants.send(None)
        async for assignment in assignments:
            # Fetching the next assignment during this generation hides the
            # request's round trip; a slow backend asks only when done, so an
            # assignment never waits out its deadline behind another.
            early = self._generate_s < self.config.prefetch_below_s
            if early:
                await wants.send(None)
            started = time.monotonic()
            await self.roll_out(assignment)
            self._generate_s = time.monotonic() - started
            if not early:
                await wants.send(None)

    async def _deliver_all(self, batches: trio.MemoryReceiveChannel[RolloutBatch]) -> None:
        in_flight = trio.Semaphore(self.config.max_deliveries)
        async with trio.open_nursery() as nursery:
            async for batch in batches:
                await in_flight.acquire()
                nursery.start_soon(self._deliver_one, batch, in_flight)

    async def _deliver_one(self, batch: RolloutBatch, in_flight: trio.Semaphore) -> None:
        try:
            await self.deliver(batch)
        except (RequestFailed, ProtocolError) as exc:
            # The work loop notices a lost learner on its next request and
            # backs off; this batch's prompts go to another node.
            event(log, logging.WARNING, "batch not delivered", version=batch.version, error=exc)
        finally:
            in_flight.release()

    async def find_learner(self, *, keep_waiting: bool = True) -> None:
        """Look up a learner and read its job from its signed manifest record
        (``echo_node.learner_lookup``); ``NoLearnerFound`` if none answers.

        Told no learner, job or invite, a node that has worked for a job
        keeps to it (``echo_node.job_memory``): it looks only for that job's
        learner, for as long as it takes with ``keep_waiting``."""
        assert self.swarm is not None
        cfg = self.config
        # A stranger's job is taken only if this machine could run it.
        check = self.weights.check_job if self.weights is not None else check_model
        named = cfg.learner or cfg.job_id or self.learner_addrs
        kept = None if named else job_memory.recall(cfg.job_path)
        if kept is None:
            found = await find_learner(self.swarm, cfg, self.learner_addrs, check)
        else:
            event(
                log,
                logging.WARNING,
                "waiting for the learner of the job this node worked for; --job-id, --learner or an invite "
                "moves it to another job",
                learner=kept.learner,
                job=kept.job_id,
                remembered_in=str(cfg.job_path),
            )
            kept_cfg = dataclasses.replace(cfg, learner=kept.learner, job_id=kept.job_id)
            while True:
                try:
                    found = await find_learner(self.swarm, kept_cfg, (), check)
                    break
                except NoLearnerFound:
                    if not keep_waiting:
                        raise
                    event(log, logging.WARNING, "still waiting for the learner", learner=kept.learner)
        self.learner, self.record, self.job_id = found.peer, found.record, found.record.job_id
        self._learner_at = found.addrs

    async def _relocate(self) -> None:
        """Look for the learner again where it may have moved (after a failed request)."""
        assert self.swarm is not None and self.learner is not None
        self._learner_at = await relocate_learner(
            self.swarm, self.learner, self._learner_at, self.config.request_timeout_s
        )

    async def _delay(self) -> None:
        """Emulated wide-area latency before a learner message (benchmarks only)."""
        if self.config.emulate_delay_ms:
            await trio.sleep(self.config.emulate_delay_ms / 1000)

    async def request_work(self) -> WorkAssignment | None:
        """Ask the learner for prompts; make sure we hold a version it accepts.

        None when it has no work now (after waiting as long as it asked)."""
        assert self.swarm is not None and self.learner is not None and self.backend is not None
        assert self.weights is not None
        cfg = self.config
        if self.version < 0:
            # Weights before work: an assignment taken first would wait out
            # the whole download (minutes for a big model) and could expire.
            await self.weights.update(0)
        await self._delay()
        ask = WorkRequest(
            job_id=self.job_id,
            max_prompts=cfg.max_prompts,
            held_version=self.version,
            backend=self.backend.name,
            dtype=self.backend.dtype,
            name=cfg.name,
            reachability=self.reachability.status,
            device=self.backend.device.kind,
            memory_mib=self._free() // 2**20,
            tokens_per_s=round(self.tokens_per_s, 1),
        )
        assert self.streams is not None
        reply = await ask_once(self.streams, self.learner, ask, cfg.work_timeout_s)
        if reply is None:
            return None
        self.weights.named(reply.version)
        prompt_ids = [p.prompt_id for p in reply.prompts]
        event(
            log,
            logging.DEBUG,
            "assigned prompts",
            prompts=prompt_ids,
            version=reply.version,
            min_version=reply.min_version,
            held=self.version,
        )
        try:
            while self.version < reply.min_version:
                # What we hold is outside the learner's window: fetch first. Each
                # pass loads a newer version (maybe one finished before the newest).
                await self.weights.update(reply.version)
            assert self.weights.limits is not None
            check_assignment(reply, self.weights.limits)
            self._prompts_per_call(reply)  # Refused when not even one group fits in memory
        except (Refused, VersionTooLarge, RequestFailed, ProtocolError) as exc:
            # Nothing tells the learner: they lapse at its deadline (a strike).
            event(log, logging.WARNING, "dropping assigned prompts", prompts=prompt_ids, error=exc)
            raise
        # Otherwise work with what we hold while Weights.follow fetches the
        # newest (async mode: the broadcast overlaps generation).
        return reply

    def _free(self) -> int:
        assert self.backend is not None
        return free_bytes(self.backend.device, self._max_memory)

    def _prompts_per_call(self, work: WorkAssignment) -> int:
        """How many of ``work``'s prompts to generate at once within free memory."""
        assert self.backend is not None and self.weights is not None and self.weights.shape is not None
        longest = max(len(p.tokens) for p in work.prompts)
        return prompts_per_call(
            self.weights.shape,
            self.backend.spec,
            len(work.prompts),
            work.group_size,
            longest,
            work.max_new_tokens,
            self._free(),
        )

    async def roll_out(self, work: WorkAssignment) -> None:
        """Generate and sign one assignment; the submitter delivers it."""
        assert self._outbox is not None, "roll_out runs inside run()"
        await self._outbox.send(await self.make_batch(work))

    async def deliver(self, batch: RolloutBatch) -> None:
        """Submit ``batch``, check its receipt and keep it."""
        reply = await self.submit(batch)
        if isinstance(reply, ErrorReply):
            raise RequestFailed(f"learner refused the batch: {reply.code}: {reply.message}")
        assert self.learner is not None
        receipts.check_receipt(batch, reply, self.learner.to_base58(), self.me, self.job_id)
        if reply.verdict == "accepted":
            self.receipts_accepted += 1
            self._remember_job()
        else:
            event(log, logging.WARNING, "batch refused", reason=reply.reason, version=batch.version)
        event(
            log,
            logging.DEBUG,
            "batch delivered",
            prompts=[g.prompt_id for g in batch.groups],
            version=batch.version,
            verdict=reply.verdict,
        )
        self.rollouts_sent += sum(len(g.completions) for g in batch.groups)
        receipts.save_receipt(self.config.receipts_path, reply, self.config.receipts_max_mb)

    def _remember_job(self) -> None:
        """After an accepted batch: this is the job a restart keeps to."""
        assert self.learner is not None
        worked = job_memory.WorkedFor(job_id=self.job_id, learner=self.learner.to_base58())
        if worked != self._worked_for:
            job_memory.remember(self.config.job_path, worked)
            self._worked_for = worked

    async def make_batch(self, work: WorkAssignment) -> RolloutBatch:
        """Generate the assignment's groups with the weights we hold; sign them."""
        assert self.backend is not None and self.weights is not None
        async with self.weights.in_use:
            version = self.version  # the batch declares the version that really generated it
            t0 = time.monotonic()
            try:
                per_call = self._prompts_per_call(work)
            except Refused:  # memory got short since we took the work: one group at a time
                per_call = 1
            samples = await trio.to_thread.run_sync(generate_in_calls, self.backend, work, per_call)
            tokens = sum(len(s.tokens) for group in samples for s in group)
            if self.config.emulate_tokens_per_s:  # a slower machine, for benchmarks
                await trio.sleep(max(0.0, t0 + tokens / self.config.emulate_tokens_per_s - time.monotonic()))
        seconds = time.monotonic() - t0
        rate = tokens / max(seconds, 1e-6)
        self.tokens_per_s = rate if not self.tokens_per_s else 0.7 * self.tokens_per_s + 0.3 * rate
        return self.identity.sign(
            RolloutBatch(
                job_id=work.job_id,
                version=version,
                peer_id=self.me,
                nonce=os.urandom(16),
                backend=self.backend.name,
                dtype=self.backend.dtype,
                device=self.backend.device.kind,
                generate_ms=int(seconds * 1000),
                groups=tuple(
                    RolloutGroup(p.prompt_id, tuple(Completion(s.tokens, s.logprobs) for s in group))
                    for p, group in zip(work.prompts, samples)
                ),
                signature=UNSIGNED,
            )
        )

    async def submit(self, batch: RolloutBatch) -> Receipt | ErrorReply:
        assert self.streams is not None and self.learner is not None
        await self._delay()
        return await self.streams.request(
            self.learner,
            rollout.PROTOCOLS,
            lambda stream: rollout.submit(stream, batch),
            timeout_s=self.config.request_timeout_s,
        )

    async def fetch_receipts(self) -> list[Receipt]:
        """Every receipt the learner holds for this node, each signature checked."""
        assert self.swarm is not None and self.learner is not None
        return await receipts.fetch_all(self.swarm, self.learner, self.me, self.job_id, self.config.request_timeout_s)
