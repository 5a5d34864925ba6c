"""The learner process: serves work, receives rollouts, trains, publishes weights.

One nursery (the host's) owns everything. ``run`` reads top to bottom:
join the swarm, publish version 0, announce the job, then train step by step.
Each step opens a ``Round`` of prompts; nodes take prompts through the work
protocol and return signed rollouts through the rollout protocol; when every
prompt has its group the step trains (in a worker thread) and publishes the
next version.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from typing import Any

import torch
import trio
from libp2p.abc import INetStream
from tqdm import tqdm

from echo_learner.config import LearnerConfig
from echo_learner.ledger import Ledger, Row
from echo_learner.model import ModelShape, build_model, build_tokenizer, config_json, tokenizer_digest
from echo_learner.rounds import Round, Slot
from echo_learner.tasks import TASKS
from echo_learner.trainer import ScoredGroup, StepStats, Trainer
from echo_learner.verify import ACCEPTED, Limits, check_batch
from protocol import codec, framing, manifest
from protocol.broadcast.engine import BroadcastConfig, BroadcastEngine
from protocol.broadcast.store import VersionStore
from protocol.host import full_addrs
from protocol.identity import Identity
from protocol.ids import JOB_DIRECTORY_KEY, ROLLOUT_PROTOCOL, WORK_PROTOCOL, manifest_key
from protocol.logs import event
from protocol.messages import (
    UNSIGNED,
    ErrorReply,
    NoWork,
    Prompt,
    Receipt,
    RolloutBatch,
    RolloutGroup,
    WorkAssignment,
    WorkRequest,
)
from protocol.rpc import remote_peer, serve
from protocol.swarm import Swarm, connect_bootstrap, open_swarm

log = logging.getLogger(__name__)

DHT_TIMEOUT_S = 10.0


def now_ms() -> int:
    return int(time.time() * 1000)


class Learner:
    def __init__(self, config: LearnerConfig, identity: Identity):
        self.config = config
        self.identity = identity
        self.me = identity.peer_id_str
        self.job_id = config.job_id or f"{config.task}-{self.me[-8:]}"
        self.task = TASKS[config.task]
        self.rng = random.Random(config.seed)
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.tokenizer = build_tokenizer()
        self.model = build_model(ModelShape(seed=config.seed))
        self.trainer = Trainer(
            self.model, lr=config.lr, clip_eps=config.clip_eps, pad_id=self.tokenizer.pad_token_id
        )
        self.ledger = Ledger(config.ledger_path)
        self.limits = Limits(
            job_id=self.job_id,
            vocab_size=len(self.tokenizer),
            group_size=config.group_size,
            max_new_tokens=config.max_new_tokens,
        )
        self.version = -1
        self.round: Round | None = None
        self.next_prompt_id = 0
        self._changed = trio.Event()
        self.swarm: Swarm | None = None
        self.engine: BroadcastEngine | None = None
        self.rollouts_accepted = 0
        self.batches_refused = 0
        self.contributors: set[str] = set()

    # --- lifecycle -------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve and train for ``config.steps`` steps, then return.

        Cancelling it stops serving at once; the ledger holds every verdict
        already answered.
        """
        cfg = self.config
        try:
            async with (
                open_swarm(self.identity, cfg.listen, server=True) as swarm,
                trio.open_nursery() as nursery,
            ):
                self.swarm = swarm
                await connect_bootstrap(swarm, cfg.bootstrap, cfg.bootstrap_timeout_s)
                host = swarm.host
                host.set_stream_handler(
                    WORK_PROTOCOL, serve(WORK_PROTOCOL, self.handle_work, cfg.request_timeout_s)
                )
                host.set_stream_handler(
                    ROLLOUT_PROTOCOL,
                    serve(ROLLOUT_PROTOCOL, self.handle_rollouts, cfg.request_timeout_s),
                )
                # The learner seeds each version into the swarm's broadcast.
                weights_dir = cfg.data_dir / "weights" / self.job_id
                shutil.rmtree(weights_dir, ignore_errors=True)  # a fresh run restarts at v0
                store = VersionStore(weights_dir, learner_id=self.me, keep=cfg.keep_versions)
                self.engine = BroadcastEngine(
                    swarm, store, job_id=self.job_id, learner_id=self.me, is_seed=True,
                    config=BroadcastConfig(max_upload_mbit=cfg.max_upload_mbit),
                )
                await nursery.start(self.engine.run)
                await self.publish()
                await self.announce()
                task_status.started(full_addrs(host))
                await self.train()
                nursery.cancel_scope.cancel()
        finally:
            self.ledger.close()

    async def announce(self) -> None:
        """Tell the DHT that this learner runs a job, so nodes can find it."""
        assert self.swarm is not None
        with trio.move_on_after(DHT_TIMEOUT_S) as scope:
            ok = await self.swarm.dht.provide(JOB_DIRECTORY_KEY)
        if scope.cancelled_caught or not ok:
            event(log, logging.WARNING, "could not announce the job in the DHT yet")

    def _notify(self) -> None:
        """Wake every work request waiting for prompts."""
        self._changed.set()
        self._changed = trio.Event()

    # --- training ----------------------------------------------------------------

    def _new_round(self) -> Round:
        slots = []
        bos = self.tokenizer.bos_token_id
        for _ in range(self.config.prompts_per_step):
            prompt = self.task.sample(self.rng)
            ids = self.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
            slots.append(Slot(self.next_prompt_id, prompt, (bos, *ids)))
            self.next_prompt_id += 1
        return Round(self.version, slots, self.config.assignment_timeout_s)

    async def train(self) -> None:
        cfg = self.config
        started = time.monotonic()
        bar = tqdm(total=cfg.steps, desc="training", unit="step", disable=None)
        for step in range(cfg.steps):
            self.round = self._new_round()
            self._notify()
            await self.round.done.wait()
            groups = self.round.results()
            self.round = None
            t0 = time.monotonic()
            stats: StepStats = await trio.to_thread.run_sync(self.trainer.step, groups)
            train_s = time.monotonic() - t0
            await self.publish()
            self._write_metrics(step, stats, train_s, time.monotonic() - started)
            bar.set_postfix(reward=f"{stats.reward_mean:.3f}", version=self.version)
            bar.update(1)
        bar.close()

    def _write_metrics(self, step: int, stats: StepStats, train_s: float, elapsed_s: float) -> None:
        record = {
            "step": step,
            "version": self.version,
            "reward_mean": stats.reward_mean,
            "loss": stats.loss,
            "tokens": stats.tokens,
            "train_s": round(train_s, 4),
            "elapsed_s": round(elapsed_s, 3),
            "rollouts_accepted": self.rollouts_accepted,
            "batches_refused": self.batches_refused,
            "contributors": len(self.contributors),
        }
        with open(self.config.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        event(log, logging.INFO, "step", **record)

    # --- publishing --------------------------------------------------------------

    async def publish(self) -> None:
        """Chunk and sign the current weights as the next version; put the manifest in the DHT."""
        assert self.swarm is not None and self.engine is not None
        weights = await trio.to_thread.run_sync(self.trainer.weights)
        self.version += 1
        signed, chunks = manifest.build(
            self.identity,
            job_id=self.job_id,
            version=self.version,
            parent_version=self.version - 1,
            task=self.task.name,
            model_config=config_json(self.model),
            tokenizer_digest=tokenizer_digest(self.tokenizer),
            weights=weights,
            chunk_size=self.config.chunk_size,
        )
        await self.engine.publish(signed, chunks)
        with trio.move_on_after(DHT_TIMEOUT_S) as scope:
            await self.swarm.dht.put_value(manifest_key(self.me), codec.encode(signed))
        if scope.cancelled_caught:
            event(log, logging.WARNING, "DHT put of the manifest timed out", version=self.version)

    # --- protocol handlers -------------------------------------------------------

    async def handle_work(self, stream: INetStream) -> None:
        peer = remote_peer(stream)
        req = await framing.receive(stream, WorkRequest)
        if req.job_id != self.job_id:
            await framing.send(stream, ErrorReply("unknown_job", f"this learner runs {self.job_id}"))
            return
        with trio.move_on_after(self.config.long_poll_s):
            while True:
                if self.round is not None:
                    slots = self.round.take(peer, min(req.max_prompts, self.config.prompts_per_request))
                    if slots:
                        await framing.send(stream, self._assignment(self.round, slots))
                        return
                await self._changed.wait()
        await framing.send(
            stream,
            NoWork(self.job_id, max(self.version, 0), retry_after_ms=0, reason="all prompts taken"),
        )

    def _assignment(self, round_: Round, slots: list[Slot]) -> WorkAssignment:
        return WorkAssignment(
            job_id=self.job_id,
            version=round_.version,
            prompts=tuple(Prompt(s.prompt_id, s.tokens) for s in slots),
            group_size=self.config.group_size,
            max_new_tokens=self.config.max_new_tokens,
            temperature=1.0,
            stop_token_ids=(self.tokenizer.eos_token_id,),
            deadline_ms=now_ms() + int(self.config.assignment_timeout_s * 1000),
        )

    async def handle_rollouts(self, stream: INetStream) -> None:
        sender = remote_peer(stream)
        batch = await framing.receive(stream, RolloutBatch)
        reason = check_batch(batch, sender, self.round, self.ledger, self.limits)
        scored: list[tuple[Slot, ScoredGroup]] = []
        if reason is None and self.round is not None:
            scored = [self._score(self.round, sender, g) for g in batch.groups]
        tokens = sum(len(c.tokens) for g in batch.groups for c in g.completions)
        rollouts = sum(len(g.completions) for g in batch.groups)
        accepted = reason is None
        receipt = self.identity.sign(
            Receipt(
                job_id=self.job_id,
                batch_hash=codec.digest(batch),
                peer_id=batch.peer_id,
                version=batch.version,
                verdict="accepted" if accepted else "refused",
                reason=ACCEPTED if accepted else reason,
                tokens=tokens if accepted else 0,
                # Credit rule: one unit per verified completion token; nothing
                # for a refused batch.
                credit=float(tokens) if accepted else 0.0,
                created_ms=now_ms(),
                learner_id=self.me,
                signature=UNSIGNED,
            )
        )
        # Write before ack: the row is committed before the node sees its receipt.
        self.ledger.record(
            Row(
                batch_hash=receipt.batch_hash,
                peer=sender,
                version=batch.version,
                nonce=batch.nonce,
                rollouts=rollouts,
                tokens=receipt.tokens,
                verdict=receipt.verdict,
                reason=receipt.reason,
                credit=receipt.credit,
                created_ms=receipt.created_ms,
                receipt=codec.encode(receipt),
            )
        )
        if accepted and self.round is not None:
            for slot, group in scored:
                self.round.fill(slot, group)
            self.rollouts_accepted += rollouts
            self.contributors.add(sender)
        else:
            self.batches_refused += 1
            event(log, logging.INFO, "refused batch", peer=sender, reason=reason)
        await framing.send(stream, receipt)

    def _score(self, round_: Round, sender: str, group: RolloutGroup) -> tuple[Slot, ScoredGroup]:
        slot = round_.assigned_to(sender, group.prompt_id)
        assert slot is not None  # check_batch verified the assignment
        eos = self.tokenizer.eos_token_id
        rewards = []
        for c in group.completions:
            ids = list(c.tokens)
            if eos in ids:
                ids = ids[: ids.index(eos)]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            rewards.append(self.task.reward(slot.prompt, text))
        return slot, ScoredGroup(
            prompt_tokens=slot.tokens,
            completions=tuple(c.tokens for c in group.completions),
            behaviour_logprobs=tuple(c.logprobs for c in group.completions),
            rewards=tuple(rewards),
        )
