"""Rollout verification: every batch is checked before it is trained on or credited.

The checks run in a fixed order, cheapest and most telling first, and the
first failure is the receipt's reason (``Verifier.refusal`` runs them all):

    size and schema (the codec, before this module) -> sender not banned
    -> sender not caught cheating before -> signature -> job id -> a backend,
    dtype and device we support -> prompts assigned to this node -> policy
    version inside the staleness window -> nonce not seen before -> token ids
    and lengths, nothing after a stop token -> assignment still this node's and
    unanswered -> log-probs recomputed by the learner, then the sampled tokens'
    plausibility as samples at the job's temperature (``check_logprobs``, in a thread)
    -> the peer's evidence over all its batches (``echo_learner.verify.evidence``)

Rewards are computed afterwards by the learner itself (``echo_learner.tasks``);
they feed the peer's evidence too (groups chosen for their rewards).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from echo_learner.verify.cpu_split import CpuSplit
from echo_learner.verify.emulate import can_emulate
from echo_learner.verify.evidence import (
    PRECISION_MISMATCH,
    SAMPLER_MISMATCH,
    SELECTED_GROUPS,
    EvidenceBook,
    EvidenceLimits,
)
from echo_learner.verify.recompute import LogprobError, Pass, Recomputer
from echo_learner.verify.tolerance import Tolerance, tolerance
from protocol import codec
from protocol.errors import SignatureError
from protocol.identity import verify_bytes
from protocol.process.logs import event
from protocol.wire.rollout import MALFORMED, RolloutBatch

if TYPE_CHECKING:
    from echo_learner.config import LearnerConfig
    from echo_learner.ledger import Ledger

log = logging.getLogger(__name__)


class Handed(Protocol):
    """A prompt as the pool handed it out (``echo_learner.swarm.pool.Assignment``)."""

    @property
    def tokens(self) -> tuple[int, ...]: ...
    @property
    def peer(self) -> str: ...  # who holds it now
    @property
    def holders(self) -> list[str]: ...  # every peer it was ever given to
    @property
    def given_back(self) -> list[str]: ...  # peers whose batch for it was refused
    @property
    def answered(self) -> bool: ...


class Assignments(Protocol):
    """Who holds which prompt (``echo_learner.swarm.pool.PromptPool``)."""

    def lookup(self, prompt_id: int) -> Handed | None: ...


class VerifyMeter(Protocol):
    """Where the recompute's cost goes (``echo_learner.swarm.capacity.CapacityMeter``)."""

    def on_verify(self, seconds: float, rollouts: int) -> None: ...


# Receipt reasons. Stable strings: nodes, the ledger and the status page show them.
ACCEPTED = "ok"
BANNED = "banned"
WRONG_SIGNER = "wrong_signer"
BAD_SIGNATURE = "bad_signature"
WRONG_JOB = "wrong_job"
NOT_ASSIGNED = "not_assigned"
OUT_OF_WINDOW = "version_out_of_window"
REPLAYED = "replayed_nonce"
BAD_GROUP = "bad_group_size"
BAD_TOKENS = "bad_tokens"
REASSIGNED = "assignment_expired"
ANSWERED = "already_answered"
BAD_LOGPROBS = "bad_logprobs"
IMPLAUSIBLE = "implausible_tokens"
UNSUPPORTED = "unsupported_dtype"

# Reasons an honest node can never earn: each counts towards a ban. (An honest
# but slow node can see its prompts reassigned or its version fall out of the
# window; those cost it the batch, not its standing.)
STRIKES = frozenset(
    {
        MALFORMED,
        WRONG_SIGNER,
        BAD_SIGNATURE,
        WRONG_JOB,
        UNSUPPORTED,
        NOT_ASSIGNED,
        REPLAYED,
        BAD_GROUP,
        BAD_TOKENS,
        BAD_LOGPROBS,
        IMPLAUSIBLE,
        PRECISION_MISMATCH,
        SAMPLER_MISMATCH,
        SELECTED_GROUPS,
    }
)


@dataclass(frozen=True)
class Limits:
    job_id: str
    vocab_size: int
    group_size: int
    max_new_tokens: int
    # Generation ends at the first of these: tokens after one were never
    # sampled by an honest node (and would be credited and trained on).
    stop_ids: frozenset[int] = frozenset()
    # Memory one recompute pass may spend on logits (--logit-memory-mib).
    max_logit_bytes: int = 2**30
    # The sampling temperature nodes are told: log-probs are recomputed at it.
    temperature: float = 1.0
    # The model's family (protocol.models.families): some widen a backend's bounds.
    family: str = "llama"


@dataclass(frozen=True)
class Window:
    """Policy versions a batch may have been generated with."""

    lo: int
    hi: int

    def __contains__(self, version: int) -> bool:
        return self.lo <= version <= self.hi


class Verifier:
    """Finds the reason to refuse a rollout batch, if any (``refusal``),
    holding what the checks read: the job's limits, the prompt pool (who
    holds which prompt), the ledger (nonces accepted before), the policy
    versions still held and the queue of log-prob recomputes over them.

    It owns that queue (``recomputer``: the learner's nursery runs
    ``recomputer.run``) and the learner's CPU split by phase (``cpu``), since
    most of what a batch costs the learner is spent here.
    """

    def __init__(
        self,
        config: LearnerConfig,
        limits: Limits,
        *,
        pool: Assignments,
        policies: Policies,
        ledger: Ledger,
        meter: VerifyMeter,
        pad_id: int,
        current_version: Callable[[], int],
    ):
        self.limits = limits
        self.pool = pool
        self.policies = policies
        self.ledger = ledger
        self.meter = meter
        self.current_version = current_version
        self.staleness = config.staleness_in_force
        self.cpu = CpuSplit()
        self.recomputer = Recomputer(
            policies.get,
            pad_id=pad_id,
            max_logit_bytes=limits.max_logit_bytes,
            temperature=limits.temperature,
            max_batches=config.verify_batch,
            max_tokens=config.verify_pass_tokens,
            emulated_versions=config.staleness_in_force + 1,
            on_pass=self._recomputed,
        )
        # (sender, nonce) of the batches in their log-prob check now: a copy
        # sent meanwhile must not pass the replay check.
        self._in_flight: set[tuple[str, bytes]] = set()
        self.evidence = EvidenceBook(
            EvidenceLimits(precision_share=config.precision_checks, reward_limit=config.selection_limit or math.inf),
            max_peers=config.max_peers_tracked,
            caught=ledger.caught(),
        )

    def window(self) -> Window:
        """Versions a rollout may be made with now: the staleness window, within
        the versions this learner still holds (a resumed learner holds fewer)."""
        version = self.current_version()
        held = min(self.policies.models, default=version)
        return Window(max(version - self.staleness, held), version)

    async def refusal(
        self, batch: RolloutBatch, sender: str, *, banned: bool, signed: bytes | None = None
    ) -> str | None:
        """Every check of ``batch`` sent by ``sender`` (``banned`` now or not),
        in order: the first failure's reason, or None if the batch is accepted.
        ``signed``: its ``codec.canonical_bytes``, when the caller has them.

        The log-prob recompute takes a while (the recomputer runs it in a
        worker thread, with other batches of the same version) and the
        assignments may change meanwhile: they are checked again after it.
        """
        if banned:
            return BANNED
        if sender in self.evidence.caught:  # whatever it sends, checked or not
            return self.evidence.caught[sender]
        key = (sender, batch.nonce)

        def nonce_seen(nonce: bytes) -> bool:
            return key in self._in_flight or self.ledger.nonce_accepted(sender, nonce)

        reason = check_batch(batch, sender, self.pool, self.window(), nonce_seen, self.limits, self.cpu, signed)
        if reason is not None:
            return reason
        declared = (batch.backend, batch.dtype, batch.device)
        emulate = None
        if can_emulate(*declared) and self.evidence.wants_emulation(sender, declared):
            emulate = (batch.backend, batch.dtype)
        prompts = [self.pool.lookup(g.prompt_id).tokens for g in batch.groups]  # type: ignore[union-attr]
        self._in_flight.add(key)
        try:
            error = await self.recomputer.error(batch.version, prompts, batch, emulate)
        finally:
            self._in_flight.discard(key)
        if error is None:  # the version was dropped while the batch waited
            return OUT_OF_WINDOW
        allowed = tolerance(batch.backend, batch.dtype, batch.device, self.limits.family)
        assert allowed is not None, "check_batch refuses unsupported combinations"
        reason = check_logprobs(error, allowed)
        if reason is not None:
            event(
                log,
                logging.INFO,
                "log-prob check failed",
                peer=sender,
                reason=reason,
                backend=batch.backend,
                dtype=batch.dtype,
                device=batch.device,
                worst=f"{error.worst:.3g}",
                mean=f"{error.mean:.3g}",
                surprise_z=f"{error.surprise_z:.2f}",
            )
            return reason
        if sender in self.evidence.caught:  # caught while this batch was recomputed
            return self.evidence.caught[sender]
        reason = self.evidence.add(sender, declared, error.evidence)
        if reason is not None:
            return self.caught(sender, reason)
        return recheck(batch, sender, self.pool)

    def caught(self, peer: str, reason: str) -> str:
        """``peer`` was caught generating otherwise than it declares
        (``reason``): it forfeits its credit and every batch it sends from now
        on is refused for that reason."""
        reason = self.evidence.catch(peer, reason)
        forfeited = self.ledger.forfeit(peer, reason, int(time.time() * 1000))
        event(log, logging.WARNING, "caught cheating", peer=peer, reason=reason, credit_forfeited=round(forfeited))
        return reason

    def _recomputed(self, done: Pass) -> None:
        self.cpu.add("recompute", done.cpu_s)
        self.meter.on_verify(done.seconds, done.rollouts)


def check_batch(
    batch: RolloutBatch,
    sender: str,
    pool: Assignments,
    window: Window,
    nonce_seen: Callable[[bytes], bool],
    limits: Limits,
    cpu: CpuSplit | None = None,
    signed: bytes | None = None,
) -> str | None:
    """The first reason to refuse ``batch`` sent by ``sender``, or ``None``
    (the signature check metered in ``cpu``; ``signed``: the batch's
    ``codec.canonical_bytes``, built here when not given)."""
    # The claimed signer must be the peer on the other end of the (Noise-
    # authenticated) connection, and the signature must be theirs.
    if batch.peer_id != sender:
        return WRONG_SIGNER
    try:
        with cpu.phase("signature") if cpu else nullcontext():
            verify_bytes(batch.peer_id, codec.canonical_bytes(batch) if signed is None else signed, batch.signature)
    except SignatureError:
        return BAD_SIGNATURE
    if batch.job_id != limits.job_id:
        return WRONG_JOB
    if tolerance(batch.backend, batch.dtype, batch.device, limits.family) is None:
        return UNSUPPORTED
    prompt_ids = [g.prompt_id for g in batch.groups]
    assignments = [pool.lookup(pid) for pid in prompt_ids]
    if len(set(prompt_ids)) != len(prompt_ids) or any(a is None or sender not in a.holders for a in assignments):
        return NOT_ASSIGNED
    if batch.version not in window:
        return OUT_OF_WINDOW
    if nonce_seen(batch.nonce):
        return REPLAYED
    for group in batch.groups:
        if len(group.completions) != limits.group_size:
            return BAD_GROUP
        for c in group.completions:
            if len(c.tokens) != len(c.logprobs) or not 0 < len(c.tokens) <= limits.max_new_tokens:
                return BAD_TOKENS
            if any(t >= limits.vocab_size for t in c.tokens):
                return BAD_TOKENS
            if any(t in limits.stop_ids for t in c.tokens[:-1]):
                return BAD_TOKENS
    return _assignments_open(batch, sender, pool)


def recheck(batch: RolloutBatch, sender: str, pool: Assignments) -> str | None:
    """What can have changed while the log-probs were recomputed: the prompts
    were answered or handed to another node. (A batch in the window when it
    came stays accepted if we publish meanwhile: the delay is ours. The
    window still holds for training, which takes no group older than it.)"""
    return _assignments_open(batch, sender, pool)


def _assignments_open(batch: RolloutBatch, sender: str, pool: Assignments) -> str | None:
    for group in batch.groups:
        a = pool.lookup(group.prompt_id)
        if a is None:  # forgotten meanwhile: the pool's memory is bounded
            return REASSIGNED
        if sender in a.given_back:  # its batch for them was refused: no honest node sends another
            return NOT_ASSIGNED
        if a.answered:
            return ANSWERED
        if a.peer != sender:
            return REASSIGNED
    return None


def check_logprobs(error: LogprobError, allowed: Tolerance) -> str | None:
    """The reason to refuse a batch whose log-probs are ``error`` away from
    the recompute under the bounds ``allowed`` for its backend, dtype and device."""
    if error.worst > allowed.worst or error.mean > allowed.mean:
        return BAD_LOGPROBS
    if abs(error.surprise_z) > allowed.z:
        return IMPLAUSIBLE
    return None


class Policies:
    """Frozen copies of the policy versions rollouts may still be made with."""

    def __init__(self, keep: int):
        self.keep = keep
        self.models: dict[int, torch.nn.Module] = {}

    def add(self, version: int, model: torch.nn.Module) -> None:
        self.models[version] = model
        for old in sorted(self.models)[: -self.keep]:
            del self.models[old]

    def get(self, version: int) -> torch.nn.Module | None:
        return self.models.get(version)
