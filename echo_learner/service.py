"""The learner process: serves work, receives rollouts, trains, publishes weights.

One nursery (the host's) owns everything. ``run`` reads top to bottom: open
the ledger, start fresh or resume from the checkpoint, join the swarm, start
the status API, publish the first version, announce the job, then train step
by step. Nodes take prompts from the pool through the work protocol and return
signed rollouts through the rollout protocol (``echo_learner.swarm.work_handler``,
``echo_learner.swarm.rollout_handler``); a
step takes a batch of verified groups from the pool, trains (in a worker
thread) and, every ``publish_every`` steps, publishes the next version.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

from echo_learner.config import LearnerConfig
from echo_learner.ledger import Ledger, now_ms
from echo_learner.metrics import LearnerMetrics
from echo_learner.swarm.bootstrap_probe import BootstrapProbe
from echo_learner.swarm.capacity import CapacityMeter
from echo_learner.swarm.directory import JobDirectory
from echo_learner.swarm.job_bounds import check_answers_fit, check_prompts_fit
from echo_learner.swarm.loop_lag import LoopLag
from echo_learner.swarm.pacing import Pacing
from echo_learner.swarm.peers import Newcomers, PeerBook
from echo_learner.swarm.pool import PromptPool
from echo_learner.swarm.publishing import JobManifestFields, Publisher
from echo_learner.swarm.receipt_pages import PageBudget, ReceiptPages
from echo_learner.swarm.rollout_handler import RolloutHandler
from echo_learner.swarm.work_handler import WorkHandler
from echo_learner.tasks.base import Task, TaskPrompt
from echo_learner.tasks.registry import load_task
from echo_learner.training import checkpoint
from echo_learner.training.device import choose as choose_device
from echo_learner.training.heldout import HeldoutMonitor
from echo_learner.training.lora import (
    LoraSettings,
    adapter_of,
    adapter_state,
    describe_lora,
    load_adapter_state,
    state_bytes,
    wrap,
)
from echo_learner.training.model import config_json, describe, load_model, render_prompt, stop_ids, tokenizer_digest
from echo_learner.training.priority import lowered, set_model_work_nice
from echo_learner.training.train_group import TrainGroup, check_train_procs
from echo_learner.training.trainer import Objective, Passes, StepStats, Trainer
from echo_learner.verify.verifier import Limits, Policies, Verifier
from protocol import codec
from protocol.broadcast import bitfield
from protocol.broadcast.engine import BroadcastConfig, BroadcastEngine
from protocol.broadcast.store import VersionStore
from protocol.identity import Identity
from protocol.manifest import manifest_digest
from protocol.messages import ErrorReply, Manifest
from protocol.net.conngate import PeerBans
from protocol.net.host import full_addrs, keep_connection, release_connection
from protocol.net.lan import discover_lan
from protocol.net.swarm import Swarm, connect_bootstrap, open_swarm
from protocol.process.files import write_atomic
from protocol.process.gc_pauses import GcPauses, freeze_heap
from protocol.process.logs import event
from protocol.process.progress import progress
from protocol.process.runtime import task_count
from protocol.rpc import KEPT_IDLE_S, Handler, remote_peer, serve, serve_kept
from protocol.wire import receipts, rollout, work
from protocol.wire.have import Have

log = logging.getLogger(__name__)

HISTORY_STEPS = 5000  # step records kept in memory for the status API
TOLD_GRACE_S = 2.0  # how long a banned peer has to read its "banned" answer before it is disconnected


class Learner:
    def __init__(self, config: LearnerConfig, identity: Identity, task: Task | None = None):
        self.identity = identity
        self.me = identity.peer_id_str
        self.task = task or load_task(config.task)
        self.max_new_tokens = config.max_new_tokens or self.task.max_new_tokens
        self.config = config = config.for_answers_of(self.max_new_tokens)
        self.job_id = config.job_for(self.me)
        self.rng = random.Random(config.seed)
        frozen_base = self._load_policy()  # DeviceUnavailable before anything is written
        self.system_prompt = config.system_prompt or self.task.system_prompt
        check_answers_fit(
            config.prompts_per_request, config.group_size, self.max_new_tokens, self.model.config.vocab_size
        )
        check_prompts_fit(self.task, self._tokens, self.model.config.to_dict(), self.max_new_tokens, config.seed)
        self.heldout = HeldoutMonitor(
            self.task,
            self.tokenizer,
            every=config.eval_every,
            prompts=config.eval_prompts,
            max_new_tokens=self.max_new_tokens,
            system_prompt=self.system_prompt,
            path=config.data_dir / "heldout.jsonl",
        )
        # In this process, or on --train-procs torchrun ranks (started by run()).
        self.trainer: Trainer | TrainGroup | None = None
        self.publisher = Publisher(
            identity,
            JobManifestFields(
                job_id=self.job_id,
                task=self.task.name,
                model_config=config_json(self.model),
                tokenizer_digest=tokenizer_digest(self.tokenizer),
                chunk_size=config.chunk_size,
            ),
            max_update_ratio=config.max_update_ratio,
            lora=self.lora,
            frozen_base=frozen_base,
            q8_base=config.q8_base,
        )
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(config.ledger_path)
        self.version = -1
        self.step = 0
        self.checkpointed_step = 0  # the step the checkpoint on disk holds
        self.started = time.time()
        self.history: deque[dict] = deque(maxlen=HISTORY_STEPS)
        # Started by run(), once the swarm is joined.
        self.swarm: Swarm | None = None
        self.directory: JobDirectory | None = None
        self.bootstrap_probe: BootstrapProbe | None = None
        self.engine: BroadcastEngine | None = None
        self.addrs: list[str] = []
        self.bytes_published = 0
        self._build_serving()

    def _load_policy(self) -> bytes | None:
        """The policy on its device, its tokenizer and LoRA settings; the frozen
        base's bytes when training a LoRA adapter (what nodes fetch once)."""
        config = self.config
        torch.set_num_threads(config.torch_threads)
        set_model_work_nice(config.model_work_nice)
        torch.manual_seed(config.seed)
        self.device, why_device = choose_device(config.device)
        if config.train_procs > 1:
            check_train_procs(config.train_procs, self.device)
        model, self.tokenizer = load_model(config.model, config.seed)
        self.lora = LoraSettings.from_config(config, model)
        frozen_base = None
        if self.lora is not None:
            frozen_base = state_bytes(model)
            model = wrap(model, self.lora)
        self.model = model.to(self.device)
        event(log, logging.INFO, "training on", device=str(self.device), why=why_device)
        return frozen_base

    def _build_serving(self) -> None:
        """What serves the nodes: peers, the prompt pool, the verifier and the
        protocol handlers over them, the meters that pace the job."""
        config = self.config
        self.peers = PeerBook(
            strikes_to_ban=config.strikes_to_ban,
            strike_window_s=config.strike_window_s,
            ban_s=config.ban_s,
            max_peers=config.max_peers_tracked,
            quiet_after_s=config.assignment_timeout_s,
            on_forget=self._release_connection,
        )
        groups = config.prompts_per_step
        capacity = groups if config.mode == "sync" else groups * config.buffer_steps
        self.pool = PromptPool(
            self._new_prompt,
            capacity=capacity,
            assignment_timeout_s=config.assignment_timeout_s,
            memory=capacity * 4 + 256,
            twin_share=config.twin_share if config.selection_limit else 0.0,
            on_lapsed=functools.partial(self.peers.lapsed, deadline_s=config.assignment_timeout_s),
            newcomers=Newcomers(self.peers, config.assignment_timeout_s),
        )
        self.policies = Policies(keep=config.staleness_in_force + 1)
        self.bans = PeerBans(max_peers=config.max_peers_tracked)
        self.metrics = LearnerMetrics(self.status)
        self.meter = CapacityMeter(config.capacity_window_s, self.metrics.timings)
        self.pacing = Pacing(config, self.meter, self.peers)
        self.verifier = Verifier(
            config,
            Limits(
                job_id=self.job_id,
                vocab_size=self.model.config.vocab_size,
                group_size=config.group_size,
                max_new_tokens=self.max_new_tokens,
                max_logit_bytes=config.logit_memory_mib * 2**20,
                temperature=config.temperature,
                stop_ids=stop_ids(self.tokenizer),
                family=self.model.config.model_type,
            ),
            pool=self.pool,
            policies=self.policies,
            ledger=self.ledger,
            meter=self.meter,
            pad_id=self.tokenizer.pad_token_id,
            current_version=lambda: self.version,
        )
        self.lag = LoopLag()
        self.collector = GcPauses()
        self.work = WorkHandler(config, verifier=self.verifier, pool=self.pool, peers=self.peers, lag=self.lag)
        self.rollouts = RolloutHandler(
            self.identity,
            verifier=self.verifier,
            pool=self.pool,
            ledger=self.ledger,
            peers=self.peers,
            task=self.task,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
        )
        self.receipt_pages = ReceiptPages(
            self.ledger,
            self.peers,
            job_id=self.job_id,
            budget=PageBudget(
                per_s=config.receipt_pages_per_s, burst=config.receipt_pages_burst, max_peers=config.max_peers_tracked
            ),
        )

    def _release_connection(self, peer: str) -> None:
        """A peer the book forgot: its connection is no longer kept open for it."""
        if self.swarm is not None:
            release_connection(self.swarm.host, ID.from_base58(peer))

    # --- lifecycle -------------------------------------------------------------

    async def _handle_work(self, stream: INetStream) -> None:
        """A work request; its node's connection is kept from then on (``keep_connection``)."""
        assert self.swarm is not None
        keep_connection(self.swarm.host, stream.muxed_conn.peer_id)
        await self.work.handle(stream)

    def _shutting_out_banned(self, handler: Handler, nursery: trio.Nursery) -> Handler:
        """``handler``, after which a peer that was banned when it asked (and
        was told so) is disconnected and its connections are refused until its
        ban ends (``PeerBans``): each of its requests would otherwise still
        cost a stream negotiation and a task."""

        async def handle(stream: INetStream) -> None:
            peer = remote_peer(stream)
            was_banned = self.peers.banned(peer)
            await handler(stream)
            if not was_banned:
                return
            peer_id = stream.muxed_conn.peer_id
            self.bans.ban(peer_id, self.peers.ban_ends(peer))
            # Closing the connection drops what the peer has not read yet: let
            # it read its answer and close its side first (or give up waiting).
            with trio.move_on_after(TOLD_GRACE_S):
                try:
                    while await stream.read(1):
                        pass
                except Exception:
                    pass  # it reset the stream: it has done with it
            # From the nursery: closing the connection ends this stream's task.
            nursery.start_soon(self.swarm.host.get_network().close_peer, peer_id)  # type: ignore[union-attr]

        return handle

    async def _handle_receipts(self, stream: INetStream) -> None:
        peer = remote_peer(stream)

        async def respond(query: receipts.ReceiptQuery) -> receipts.ReceiptPage | ErrorReply:
            return self.receipt_pages.answer(peer, query)

        await receipts.answer(stream, respond)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve and train until ``config.steps`` steps are done, then return.

        Cancelling it (Ctrl-C, SIGTERM) stops serving at once; the ledger
        holds every verdict already answered, and a checkpoint is written on
        the way out if steps were trained since the last one.
        """
        from echo_learner.operator.api import serve_api  # the HTTP server, only when running

        cfg = self.config
        thresholds = gc.get_threshold()
        try:
            self.trainer = await trio.to_thread.run_sync(self._make_trainer)
            resumed_version = self._start()
            async with (
                open_swarm(self.identity, cfg.listen, server=True, answer_probes=True, connections=cfg) as swarm,
                trio.open_nursery() as nursery,
            ):
                self.swarm = swarm
                self.bans.install(swarm.host, swarm.gate)
                self.directory = JobDirectory(swarm, self.me, cfg.manifest_put_s)
                if cfg.mdns:
                    await nursery.start(discover_lan, swarm, cfg.bootstrap_timeout_s)
                await connect_bootstrap(swarm, cfg.bootstrap, cfg.bootstrap_timeout_s)
                self.bootstrap_probe = BootstrapProbe(
                    swarm, cfg.bootstrap, cfg.bootstrap_ping_s, cfg.bootstrap_timeout_s
                )
                await nursery.start(self.bootstrap_probe.run)
                host = swarm.host
                self._serve_protocols(host, nursery)
                await self._start_broadcast(swarm, nursery)
                nursery.start_soon(self.heldout.run)
                nursery.start_soon(self.verifier.recomputer.run)
                nursery.start_soon(self.lag.run)
                nursery.start_soon(self.pacing.check_forecasts)
                api_url = await nursery.start(serve_api, self, cfg.status_host, cfg.status_port, cfg.status_token)
                # Atomically: `status`, the demo and tests read it while we run.
                write_atomic(cfg.api_path, json.dumps({"url": api_url, "pid": os.getpid()}))
                await self.publish(first_version=resumed_version)
                await self.directory.put_manifest()  # joining nodes read it: before the job is announced
                nursery.start_soon(self.directory.keep_manifest)
                await self.directory.announce()
                nursery.start_soon(self.directory.keep_announced)
                self.addrs = full_addrs(host)
                # What is loaded by now (torch, transformers, the model: ~430,000
                # objects) lives as long as the process: out of the collector's
                # full passes, each of which stopped the event loop ~0.4 s.
                gc.collect()
                freeze_heap(cfg.gc_young)
                self.collector.start()
                task_status.started((self.addrs, api_url))
                await self.train()
                nursery.cancel_scope.cancel()
        finally:
            self.collector.stop()
            gc.set_threshold(*thresholds)
            self.config.api_path.unlink(missing_ok=True)
            with trio.CancelScope(shield=True):
                try:
                    if self.step > self.checkpointed_step:
                        await self.save_checkpoint()
                        event(log, logging.WARNING, "checkpoint written on stop", step=self.step)
                finally:
                    if self.trainer is not None:
                        await trio.to_thread.run_sync(self.trainer.close)
                    self.ledger.close()

    def _serve_protocols(self, host: IHost, nursery: trio.Nursery) -> None:
        """Answer work, rollout and receipt requests (the kept versions carry
        one exchange after another on a stream; the older ones one each)."""
        timeout_s = self.config.request_timeout_s
        for protocol, handler, kept in (
            (work.PROTOCOL, self._handle_work, True),
            (work.PROTOCOL_1_4, self._handle_work, False),
            (rollout.PROTOCOL, self.rollouts.handle, True),
            (rollout.PROTOCOL_1_1, self.rollouts.handle, False),
            (receipts.PROTOCOL, self._handle_receipts, False),
        ):
            shut_out = self._shutting_out_banned(handler, nursery)
            if kept:
                host.set_stream_handler(protocol, serve_kept(protocol, shut_out, timeout_s, KEPT_IDLE_S))
            else:
                host.set_stream_handler(protocol, serve(protocol, shut_out, timeout_s))

    async def _start_broadcast(self, swarm: Swarm, nursery: trio.Nursery) -> None:
        """The learner seeds each version into the swarm's broadcast."""
        cfg = self.config
        weights_dir = cfg.data_dir / "weights" / self.job_id
        store = VersionStore(weights_dir, learner_id=self.me, keep=cfg.keep_versions)
        self.engine = BroadcastEngine(
            swarm,
            store,
            job_id=self.job_id,
            learner_id=self.me,
            is_seed=True,
            config=BroadcastConfig(max_upload_mbit=cfg.max_upload_mbit),
            variants=VersionStore(weights_dir / "variants", learner_id=self.me, keep=cfg.keep_versions),
            have_listener=self._on_have,
            # Peers that ask for work; the others get one version's worth of
            # chunks from us, then the free riders' share (issue 55).
            works=lambda peer: peer in self.peers.peers and not self.peers.banned(peer),
        )
        self.publisher.adopt_base(store)
        await self._publish_variants()
        await nursery.start(self.engine.run)

    def _make_trainer(self) -> Trainer | TrainGroup:
        """The GRPO trainer: in this process, or ``--train-procs`` FSDP ranks
        under torchrun (``echo_learner.training.train_group``) that start from this
        process's model."""
        cfg = self.config
        objective = Objective(
            clip_eps=cfg.clip_eps,
            clip_eps_high=cfg.epsilon_high or None,
            ratio_cap=cfg.ratio_cap,
            kl_coef=cfg.kl_coef,
            kl_importance_weighted=cfg.kl_importance_weighted,
            entropy_coef=cfg.entropy_coef,
            push_down_flat=cfg.push_down_flat,
            loss_type=cfg.loss_type,
            scale_rewards=cfg.scale_rewards,
            importance_level=cfg.importance_sampling_level,
            max_completion_length=cfg.max_new_tokens,
        )
        max_logit_bytes = cfg.logit_memory_mib * 2**20
        if cfg.train_procs == 1:
            precision = cfg.train_precision
            if precision == "auto":
                precision = "bf16" if self.device.type == "cuda" else "f32"
            return Trainer(
                self.model,
                objective=objective,
                lr=cfg.lr,
                pad_id=self.tokenizer.pad_token_id,
                temperature=cfg.temperature,
                passes=Passes(max_logit_bytes=max_logit_bytes, precision=precision),
            )
        settings = {
            "lr": cfg.lr,
            "pad_id": self.tokenizer.pad_token_id,
            "max_logit_bytes": max_logit_bytes,
            "temperature": cfg.temperature,
            "model": cfg.model,
            "seed": cfg.seed,
            "lora": self.lora.as_dict() if self.lora else None,
            "objective": dataclasses.asdict(objective),
            "device": self.device.type,
            "threads": cfg.torch_threads,
        }
        return TrainGroup(self.model, procs=cfg.train_procs, settings=settings)

    def _start(self) -> int:
        """Restore the checkpoint if resuming (the CLI's ``check_data_dir`` vetted the
        flags); the number of the first version to publish.

        Version numbers only ever grow within a data dir, across restarts:
        nodes may hold any version published before, so a number is never
        given to other weights.
        """
        cfg = self.config
        first_version = self.ledger.last_version() + 1
        if cfg.resume:
            state = checkpoint.load(cfg.checkpoint_path)
            if state.get("model_source", "") != cfg.model:
                raise checkpoint.CheckpointError(
                    f"the checkpoint trains --model {state.get('model_source') or '(built-in)'!r}, "
                    f"not {cfg.model or '(built-in)'!r}"
                )
            lora = self.lora.as_dict() if self.lora else None
            if adapter_of(state.get("lora")) != adapter_of(lora):
                raise checkpoint.CheckpointError(
                    f"the checkpoint trains {describe_lora(state.get('lora'))}, not {describe_lora(lora)}"
                )
            if self.lora is not None:
                load_adapter_state(self.model, state["model"])
            else:
                self.model.load_state_dict(state["model"])
            self.trainer.resume(state["optimizer"])
            checkpoint.restore_rng(self.rng, state["rng"])
            self.step = self.checkpointed_step = state["step"]
            self.pool.restore(state["pool"], version_offset=first_version - state["version"])
            event(
                log,
                logging.WARNING,
                "resumed from checkpoint",
                step=self.step,
                checkpoint_version=state["version"],
                next_version=first_version,
            )
        return first_version

    def _new_prompt(self) -> tuple[TaskPrompt, tuple[int, ...]]:
        prompt = self.task.sample(self.rng)
        return prompt, self._tokens(prompt)

    def _tokens(self, prompt: TaskPrompt) -> tuple[int, ...]:
        return render_prompt(self.tokenizer, prompt.text, self.system_prompt)

    # --- training ----------------------------------------------------------------

    async def train(self) -> None:
        cfg = self.config
        sync = cfg.mode == "sync"
        with progress("training", cfg.steps, completed=self.step) as bar:
            if not sync:
                self.pool.set_open(True)  # async: nodes generate while the learner trains
            while self.step < cfg.steps:
                if sync:
                    self.pool.set_open(True, min_version=self.version)
                asked = time.monotonic()
                batch = await self.pool.take_batch(cfg.prompts_per_step, self.version - cfg.staleness_in_force)
                if sync:
                    self.pool.set_open(False)
                staleness = sum(self.version - r.version for r in batch) / len(batch)
                t0 = time.monotonic()
                # A step once begun is counted even if we are stopped meanwhile:
                # its thread changes the weights whatever happens here, and the
                # checkpoint written on the way out must say which step they are.
                with trio.CancelScope(shield=True):
                    stats: StepStats = await trio.to_thread.run_sync(
                        lowered,
                        self.verifier.cpu.timed,
                        "train",
                        self.trainer.step,
                        [r.group for r in batch],
                    )
                    self.step += 1
                trained = time.monotonic()
                self.meter.on_train(t0, trained, waited=t0 - asked)
                if self.pacing.publish_due():
                    await self.publish()
                if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                    await self.save_checkpoint()
                self.meter.on_bookkeeping(time.monotonic() - trained)
                self._write_metrics(stats, staleness)
                bar(self.step, reward=f"{stats.reward_mean:.3f}", version=self.version)

    def _write_metrics(self, stats: StepStats, staleness: float) -> None:
        c = self.rollouts.counters
        inputs = self.pacing.on_step()
        record = {
            "step": self.step - 1,
            "version": self.version,
            "mode": self.config.mode,
            "reward_mean": stats.reward_mean,
            "loss": stats.loss,
            "kl": stats.kl,
            "tokens": stats.tokens,
            "staleness": round(staleness, 3),
            "time": round(time.time(), 3),
            "elapsed_s": round(time.time() - self.started, 3),
            "rollouts_accepted": c.rollouts_accepted,
            "batches_accepted": c.batches_accepted,
            "batches_refused": c.batches_refused,
            "refusals": dict(c.refused),  # since this start (the ledger keeps them all)
            "contributors": len(self.rollouts.contributors),
            "utilization": round(self.meter.utilization(), 4),
            "capacity": inputs.to_json(),
            "predicted_utilization": round(self.pacing.outlook(inputs).utilization, 4),
            **self.pacing.forecast_check(),
        }
        self.history.append(record)
        with open(self.config.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        event(log, logging.INFO, "step", **record)

    async def save_checkpoint(self) -> None:
        state = {
            "step": self.step,
            "version": self.version,
            "mode": self.config.mode,
            "model_source": self.config.model,
            "lora": self.lora.as_dict() if self.lora else None,
            "rng": checkpoint.rng_state(self.rng),
            "pool": self.pool.state(),
        }

        def write() -> None:
            self.trainer.sync()
            # LoRA: the adapter only; the frozen base is the --model's.
            state["model"] = adapter_state(self.model) if self.lora else self.model.state_dict()
            state["optimizer"] = self.trainer.optimizer_state()
            checkpoint.save(self.config.checkpoint_path, state)

        await trio.to_thread.run_sync(write)
        self.checkpointed_step = self.step

    # --- publishing --------------------------------------------------------------

    async def publish(self, first_version: int | None = None) -> None:
        """Publish the current weights as the next version (``_publish_version``).

        Training LoRA with no base out yet (the first start, or a restart
        whose store lost it), the frozen base goes out first as a full
        version: before the first step it is the policy itself (adapters
        start at zero), else (after a restart, or with adapters drawn at
        random by --lora-init-scale) a version nodes fetch on the way to the
        adapter that follows it.
        """
        version = self.version + 1 if first_version is None else first_version
        if self.publisher.needs_base():
            is_policy = self.step == 0 and not (self.lora is not None and self.lora.init_scale)
            await self._publish_version(version, self.publisher.build_base, policy=is_policy)
            if is_policy:
                return
            version += 1
        await self._publish_version(version, lambda v: self.publisher.build(v, self.model), policy=True)

    async def _publish_version(
        self, version: int, build: Callable[[int], tuple[Manifest, list[bytes]]], *, policy: bool
    ) -> None:
        """Chunk and sign ``version``, record it durably, seed it into the
        broadcast, and leave its manifest for the DHT (``JobDirectory``).
        ``policy``: rollouts may be made with it (else it is only a base)."""
        assert self.directory is not None and self.engine is not None
        t0 = time.monotonic()

        def build_all() -> tuple[Manifest, list[bytes], torch.nn.Module | None]:
            self.trainer.sync()
            signed, chunks = build(version)
            return signed, chunks, self.trainer.snapshot() if policy else None

        signed, chunks, snapshot = await trio.to_thread.run_sync(lowered, self.verifier.cpu.timed, "publish", build_all)
        if self.publisher.base is not None and self.publisher.base[0] is signed:
            await self._publish_variants()
        encoded = codec.encode(signed)
        self.ledger.record_version(version, self.step, now_ms(), encoded)
        if snapshot is not None:
            self.policies.add(version, snapshot)
            self.heldout.on_publish(version, self.step, snapshot)
        await self.engine.publish(signed, chunks)
        self.bytes_published += signed.total_size
        self.version = version
        self.pool.set_open(self.pool.open, min_version=version - self.config.staleness_in_force)
        self.meter.on_publish(version, t0, time.monotonic())
        self.directory.published(version, encoded)

    async def _publish_variants(self) -> None:
        """Seed the variants of the newest base (``Publisher.build_variants``)
        that the store lacks: before the base itself goes out, so that a node
        that hears of the base finds them."""
        assert self.engine is not None and self.engine.variants is not None
        base = self.publisher.base
        if base is None or base[0].version in self.engine.variants.manifests:
            return
        built = await trio.to_thread.run_sync(self.publisher.build_variants, base[0], self.config.data_dir)
        for variant, chunks in built:
            await self.engine.publish_variant(variant, chunks)
            event(
                log,
                logging.INFO,
                "published a variant",
                version=variant.version,
                format=variant.format,
                bytes=variant.total_size,
            )

    def _on_have(self, peer: str, have: Have) -> None:
        if self.engine is None or have.job_id != self.job_id:
            return
        # The version as published, or its variant (a q8_0 node's base).
        held_as = (store.manifests.get(have.version) for store in (self.engine.store, self.engine.variants) if store)
        m = next((m for m in held_as if m is not None and manifest_digest(m) == have.manifest_digest), None)
        if m is None:
            return
        try:
            held = bitfield.decode(have.bitfield, len(m.chunk_hashes))
        except Exception:  # a bad bitfield is the engine's to report
            return
        if len(held) == len(m.chunk_hashes):
            self.meter.on_node_holds(peer, have.version)

    # --- what the status API shows ---------------------------------------------------

    def status(self) -> dict:
        cfg = self.config
        c = self.rollouts.counters
        inputs = self.pacing.inputs()
        recent = list(self.history)[-20:]
        steps_per_s = 0.0
        if len(recent) >= 2 and recent[-1]["time"] > recent[0]["time"]:
            steps_per_s = (len(recent) - 1) / (recent[-1]["time"] - recent[0]["time"])
        return {
            "job_id": self.job_id,
            "learner": self.me,
            "task": self.task.name,
            "model": describe(cfg.model),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "mode": cfg.mode,
            "staleness": cfg.staleness_in_force,
            "publish_every": 1 if cfg.mode == "sync" else cfg.publish_every,
            "version": self.version,
            "step": self.step,
            "steps": cfg.steps,
            "uptime_s": round(time.time() - self.started, 1),
            "steps_per_s": round(steps_per_s, 3),
            "reward": recent[-1]["reward_mean"] if recent else None,
            "heldout": self.heldout.latest(),
            "rollouts_accepted": c.rollouts_accepted,
            "batches_accepted": c.batches_accepted,
            "batches_refused": c.batches_refused,
            "prompts_expired": self.pool.expired,
            "refusals": self.ledger.refusal_counts(),
            "contributors": len(self.rollouts.contributors),
            "peers": len(self.peers.active(within_s=cfg.capacity_window_s)),
            "banned_connections_refused": self.bans.refused,
            "cooled_sockets_closed": self.swarm.gate.cooled if self.swarm and self.swarm.gate else 0,
            "utilization": round(self.meter.utilization(), 4),
            "measurements": inputs.to_json(),
            "capacity": {**self.pacing.outlook(inputs).to_json(), **self.pacing.forecast_check()},
            "broadcast": self._broadcast_status(),
            "bootstrap": self.bootstrap_probe.to_json() if self.bootstrap_probe else [],
            "addrs": self.addrs,
            "load": {
                **self.verifier.cpu.to_json(),
                "loop_lag_ms": round(self.lag.lag_s * 1000, 1),
                "tasks": task_count(),
                **self.collector.to_json(),  # since training began (run: after the freeze)
            },
        }

    def _broadcast_status(self) -> dict:
        """The newest version: its size, how many recent nodes hold it and how
        long they took to get it; the mean time versions take to reach a node;
        all bytes published."""
        store = self.engine.store if self.engine else None
        newest = store.manifests.get(self.version) if store else None
        # A node says it holds a version in its next work request, or earlier
        # in a Have if it is one of our broadcast neighbours.
        active = self.peers.active(within_s=self.config.capacity_window_s)
        told = self.meter.holders(self.version)
        holders = sum(1 for p in active if p.held_version >= self.version or p.peer in told)
        return {
            "version": self.version,
            "bytes": newest.total_size if newest else 0,
            # safetensors (full weights), delta or lora (an update against base_version)
            "format": newest.format if newest else "",
            "base_version": newest.base_version if newest else -1,
            "holders": holders,
            "spread_s": self.meter.spread_s(self.version),
            "seconds": round(self.meter.broadcast_s, 3),
            "bytes_published": self.bytes_published,
        }
