"""What the learner does with a rollout batch (the protocol itself:
``protocol.wire.rollout``; receipts: ``echo_learner.swarm.receipt_pages``).

``judge`` verifies the batch (``echo_learner.verify``), writes the verdict to
the ledger and only then answers with the signed receipt; an accepted batch's
groups are scored and go to the pool's replay buffer, a refused batch's
prompts to another node at once. Runs under ``protocol.rpc.serve``.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from libp2p.abc import INetStream

from echo_learner.ledger import CREDIT_PER_TOKEN, Ledger, Row, now_ms
from echo_learner.swarm.peers import PeerBook
from echo_learner.swarm.pool import Assignment, PromptPool, Rollouts
from echo_learner.tasks.base import Task
from echo_learner.training.trainer import ScoredGroup
from echo_learner.verify.verifier import ACCEPTED, Verifier
from protocol import codec, framing
from protocol.errors import ProtocolError
from protocol.identity import Identity
from protocol.messages import UNSIGNED, ErrorReply
from protocol.process.logs import event
from protocol.rpc import remote_peer
from protocol.wire import rollout, work
from protocol.wire.rollout import MALFORMED, Receipt, RolloutBatch, RolloutGroup

log = logging.getLogger(__name__)


@dataclass
class Counters:
    rollouts_accepted: int = 0
    batches_accepted: int = 0
    batches_refused: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # batches refused since start, by reason


def credited_tokens(batch: RolloutBatch) -> int:
    """The tokens ``batch`` earns credit for: a completion repeated within
    its group counts once (one pass made it, however many copies are sent)."""
    return sum(len(c) for g in batch.groups for c in {c.tokens for c in g.completions})


class RolloutHandler:
    def __init__(
        self,
        identity: Identity,
        *,
        verifier: Verifier,
        pool: PromptPool,
        ledger: Ledger,
        peers: PeerBook,
        task: Task,
        decode: Callable[[list[int]], str],
    ):
        """``decode``: token ids to the text ``task`` rewards."""
        self.identity = identity
        self.me = identity.peer_id_str
        self.verifier = verifier
        # Verdicts are written where batches are checked against: the
        # verifier's limits and CPU split.
        self.limits = verifier.limits
        self.job_id = verifier.limits.job_id
        self.cpu = verifier.cpu
        self.pool = pool
        self.ledger = ledger
        self.peers = peers
        self.task = task
        self.decode = decode
        self.counters = Counters()
        self.contributors: set[str] = set()

    async def handle(self, stream: INetStream) -> None:
        sender = remote_peer(stream)
        if self.peers.banned(sender):
            # Not read, and no ledger row: a banned peer sending batch after
            # batch would otherwise grow the ledger by a refused row each.
            await framing.send(stream, ErrorReply(work.BANNED, "too many strikes; try again later"))
            return
        await rollout.answer(
            stream,
            lambda batch, frame: self.judge(sender, batch, frame),
            lambda exc: self._record_malformed(sender, exc),
            on_decoded=lambda seconds: self.cpu.add("decode", seconds),
        )

    async def judge(self, sender: str, batch: RolloutBatch, frame: bytes | None = None) -> Receipt:
        """Verify ``batch`` (it came in ``frame``: kept as it is, not encoded
        again), record the verdict in the ledger and return the signed
        receipt (sent only after the ledger write)."""
        # What the node signed, and the batch's id: built once for both.
        with self.cpu.phase("signature"):
            signed = codec.canonical_bytes(batch)
        reason = await self.verifier.refusal(batch, sender, banned=self.peers.banned(sender), signed=signed)
        accepted = reason is None
        rollouts = sum(len(g.completions) for g in batch.groups)
        tokens = credited_tokens(batch)
        with self.cpu.phase("receipt"):
            receipt = self._receipt(batch, hashlib.sha256(signed).digest(), reason, tokens)
        # Write before ack: the row (and an accepted batch itself) is committed
        # before the node sees its receipt.
        with self.cpu.phase("ledger"):
            kept = (frame if frame is not None else codec.encode(batch)) if accepted else None
            self.ledger.record(Row.of_receipt(receipt, peer=sender, nonce=batch.nonce, rollouts=rollouts, batch=kept))
        cycle_s = None
        if reason is None:
            cycle_s = self._take(sender, batch, rollouts)
        else:
            self._give_back(sender, batch, reason)
        # generate_ms is the node's own word; it only feeds the capacity forecast.
        self.peers.on_verdict(sender, receipt.reason, rollouts, receipt.tokens, cycle_s, batch.generate_ms / 1000)
        self.peers.seen(sender).caught = self.verifier.evidence.caught.get(sender, "")
        return receipt

    def _take(self, sender: str, batch: RolloutBatch, rollouts: int) -> float:
        """Score the accepted ``batch``'s groups into the pool; the seconds
        ``sender`` worked on it.

        The node worked on it since it was handed out, or since its previous
        batch came in if it took this one early (nodes fetch their next
        assignment while generating): then the trip to us overlaps the next
        generation and costs it nothing."""
        assignments = [self.pool.lookup(g.prompt_id) for g in batch.groups]
        now, stats = trio.current_time(), self.peers.seen(sender)
        busy_since = max(min(a.handed_at for a in assignments if a is not None), stats.answered_at)
        stats.answered_at = now
        rewards = []
        for a, group in zip(assignments, batch.groups):
            assert a is not None
            scored = self._score(a, group)
            self.pool.answer(a, Rollouts(batch.version, sender, scored))
            rewards.append(list(scored.rewards))
        declared = (batch.backend, batch.dtype, batch.device)
        twins = [a.twin for a in assignments if a is not None]
        for peer, reason in self.verifier.evidence.add_rewards(sender, declared, batch.version, rewards, twins).items():
            self.verifier.caught(peer, reason)  # its next batch is refused
        self.counters.rollouts_accepted += rollouts
        self.counters.batches_accepted += 1
        self.cpu.accepted += 1
        self.contributors.add(sender)
        return now - busy_since

    def _give_back(self, sender: str, batch: RolloutBatch, reason: str) -> None:
        """Count and log the refused ``batch``, and hand its prompts to
        another node now, not at their deadline (a sync step would wait that
        long for them); the sender keeps none of them. Their lapse is no
        strike: a batch made in good faith with a version we have since left
        behind earns none, and any other refusal is struck once, by the
        ledger's verdict."""
        self.counters.batches_refused += 1
        self.counters.refused[reason] += 1
        handed, window = self.pool.lookup(batch.groups[0].prompt_id) if batch.groups else None, self.verifier.window()
        event(
            log,
            logging.INFO,
            "refused batch",
            peer=sender,
            reason=reason,
            version=batch.version,
            window=f"{window.lo}-{window.hi}",
            # When and at which version its prompts were handed out: says
            # whether the node was slow or given too little time.
            handed_at_version=handed.version if handed else None,
            handed_s_ago=round(trio.current_time() - handed.handed_at, 2) if handed else None,
        )
        self.pool.release(sender, [g.prompt_id for g in batch.groups])

    def _receipt(self, batch: RolloutBatch, batch_hash: bytes, reason: str | None, tokens: int) -> Receipt:
        """The signed verdict on ``batch`` (its ``codec.digest``: ``batch_hash``),
        accepted if ``reason`` is None."""
        accepted = reason is None
        return self.identity.sign(
            Receipt(
                job_id=self.job_id,
                batch_hash=batch_hash,
                peer_id=batch.peer_id,
                version=batch.version,
                verdict="accepted" if accepted else "refused",
                reason=reason or ACCEPTED,
                tokens=tokens if accepted else 0,
                credit=tokens * CREDIT_PER_TOKEN if accepted else 0.0,
                created_ms=now_ms(),
                learner_id=self.me,
                signature=UNSIGNED,
            )
        )

    def _score(self, assignment: Assignment, group: RolloutGroup) -> ScoredGroup:
        rewards = []
        for c in group.completions:
            ids = list(c.tokens)
            stop = next((i for i, t in enumerate(ids) if t in self.limits.stop_ids), len(ids))
            ids = ids[:stop]
            rewards.append(self.task.reward(assignment.prompt, self.decode(ids)))
        return ScoredGroup(
            prompt_tokens=assignment.tokens,
            completions=tuple(c.tokens for c in group.completions),
            behaviour_logprobs=tuple(c.logprobs for c in group.completions),
            rewards=tuple(rewards),
        )

    def _record_malformed(self, sender: str, exc: ProtocolError) -> None:
        """An undecodable or oversized batch is a verdict too: a ledger row, a strike."""
        self.ledger.record(Row.unread(sender, MALFORMED, now_ms()))
        self.counters.batches_refused += 1
        self.counters.refused[MALFORMED] += 1
        self.peers.on_verdict(sender, MALFORMED, 0, 0)
        event(log, logging.INFO, "refused batch", peer=sender, reason=MALFORMED, error=exc)
