"""Rollout verification: every batch is checked before it is trained on or credited.

The checks run in a fixed order, cheapest and most telling first, and the
first failure is the receipt's reason (``verify_batch`` runs them all):

    size and schema (the codec, before this module) -> sender not banned
    -> signature -> job id -> a backend, dtype and device we support -> prompts
    assigned to this node -> policy version
    inside the staleness window -> nonce not seen before -> token ids and
    lengths, nothing after a stop token -> assignment still this node's and
    unanswered
    -> log-probs recomputed by the learner, then the sampled tokens'
    plausibility as samples at the job's temperature (``check_logprobs``, in a thread)

Rewards are computed afterwards by the learner itself (``echo_learner.tasks``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import trio

from echo_learner.logprobs import grouped_token_stats
from echo_learner.pool import PromptPool
from echo_learner.tolerance import Tolerance, tolerance
from protocol.errors import SignatureError
from protocol.identity import verify
from protocol.logs import event
from protocol.wire.rollout import MALFORMED, RolloutBatch

log = logging.getLogger(__name__)

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
        UNSUPPORTED,
        NOT_ASSIGNED,
        REPLAYED,
        BAD_GROUP,
        BAD_TOKENS,
        BAD_LOGPROBS,
        IMPLAUSIBLE,
    }
)


# Whether the sampled tokens are what sampling at the job's temperature from the claimed
# version gives (after GRAIL's token-plausibility check). For each token, its
# surprise under the learner's recompute, -log p(token), minus the entropy of
# the distribution it was drawn from has mean 0 and a known variance; over a
# batch, z = sum(surprise - entropy) / sqrt(sum(variance)) is about standard
# normal for an honest node whatever its log-prob tolerance. Tokens picked by
# hand, sampled from another model, or greedily drift far from 0 (a forger can
# always report the exact log-probs of tokens it chose: the tolerance alone
# cannot catch that). The limits (``Tolerance.z``) are in echo_learner/tolerance.py.
#
# Not quite normal where the policy is peaked: one honest token drawn at
# p = 1e-4 from a distribution of entropy ~0.01 is ~9 nats out while the whole
# batch's standard deviation is ~1, so a batch of one prompt scored |z| > 8
# about once in 750 (bench/convergence.py, sync, reward 0.8: two honest
# batches refused, each a strike and a 33 s pause). The largest single
# deviation is therefore added to the variance: one rare token moves z by
# less than 1, k of them by about k, while a forger's many shifted tokens
# still add up (tests/learner/test_logprob_check.py).


@dataclass(frozen=True)
class LogprobError:
    """|reported - recomputed| log-prob over a batch's sampled tokens, and
    how plausible the tokens are as samples at the job's temperature (``surprise_z``)."""

    worst: float
    mean: float
    surprise_z: float = 0.0


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
    # The model's family (protocol.families): some widen a backend's bounds.
    family: str = "llama"


@dataclass(frozen=True)
class Window:
    """Policy versions a batch may have been generated with."""

    lo: int
    hi: int

    def __contains__(self, version: int) -> bool:
        return self.lo <= version <= self.hi


async def verify_batch(
    batch: RolloutBatch,
    sender: str,
    *,
    banned: bool,
    pool: PromptPool,
    window: Callable[[], Window],
    nonce_accepted: Callable[[bytes], bool],
    limits: Limits,
    policies: Policies,
    pad_id: int,
    in_flight: set[tuple[str, bytes]],
    on_recomputed: Callable[[float], None],
) -> str | None:
    """Every check of ``batch`` sent by ``sender``, in order: the first
    failure's reason, or None if the batch is accepted.

    ``window()`` is asked twice: the log-prob recompute takes a while (it runs
    in a worker thread, reported to ``on_recomputed(seconds)``) and the window
    may move meanwhile. ``in_flight`` holds the (sender, nonce) of batches
    being recomputed now, so that a copy sent meanwhile counts as replayed.
    """
    if banned:
        return BANNED
    key = (sender, batch.nonce)

    def nonce_seen(nonce: bytes) -> bool:
        return key in in_flight or nonce_accepted(nonce)

    reason = check_batch(batch, sender, pool, window(), nonce_seen, limits)
    if reason is not None:
        return reason
    model = policies.get(batch.version)
    if model is None:
        return OUT_OF_WINDOW
    prompts = [pool.lookup(g.prompt_id).tokens for g in batch.groups]  # type: ignore[union-attr]
    in_flight.add(key)
    started = time.monotonic()
    try:
        error = await trio.to_thread.run_sync(
            logprob_error, model, prompts, batch, pad_id, limits.max_logit_bytes, limits.temperature
        )
    finally:
        in_flight.discard(key)
    on_recomputed(time.monotonic() - started)
    allowed = tolerance(batch.backend, batch.dtype, batch.device, limits.family)
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
    return recheck(batch, sender, pool)


def check_batch(
    batch: RolloutBatch,
    sender: str,
    pool: PromptPool,
    window: Window,
    nonce_seen: Callable[[bytes], bool],
    limits: Limits,
) -> str | None:
    """The first reason to refuse ``batch`` sent by ``sender``, or ``None``."""
    # The claimed signer must be the peer on the other end of the (Noise-
    # authenticated) connection, and the signature must be theirs.
    if batch.peer_id != sender:
        return WRONG_SIGNER
    try:
        verify(batch, batch.peer_id)
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


def recheck(batch: RolloutBatch, sender: str, pool: PromptPool) -> str | None:
    """What can have changed while the log-probs were recomputed: the prompts
    were answered or handed to another node. (A batch in the window when it
    came stays accepted if we publish meanwhile: the delay is ours. The
    window still holds for training, which takes no group older than it.)"""
    return _assignments_open(batch, sender, pool)


def _assignments_open(batch: RolloutBatch, sender: str, pool: PromptPool) -> str | None:
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


@torch.no_grad()
def logprob_error(
    model: torch.nn.Module,
    prompts: list[tuple[int, ...]],
    batch: RolloutBatch,
    pad_id: int,
    max_logit_bytes: int = 2**30,
    temperature: float = 1.0,
) -> LogprobError:
    """|reported - recomputed| log-prob over every sampled token of ``batch``.

    ``model`` is the policy version the batch claims and ``prompts[i]`` the
    tokens of the prompt its group ``i`` answers (looked up by the caller:
    this runs in a worker thread and must not touch the pool).
    """
    assert len(prompts) == len(batch.groups), "one prompt per group"
    mine = grouped_token_stats(
        model,
        prompts,
        [[c.tokens for c in g.completions] for g in batch.groups],
        pad_id,
        max_logit_bytes,
        temperature,
    )
    pairs = [
        (stats, torch.tensor(c.logprobs, dtype=torch.float32))
        for group, recomputed_group in zip(batch.groups, mine)
        for c, stats in zip(group.completions, recomputed_group)
    ]
    diff = torch.cat([(stats.logprobs - reported).abs() for stats, reported in pairs])
    deviations = torch.cat([-stats.logprobs - stats.entropy for stats, _ in pairs])
    # The largest single deviation joins the variance, so no one token decides.
    spread = sum(float(stats.variance.sum()) for stats, _ in pairs) + float(deviations.abs().max()) ** 2
    z = float(deviations.sum()) / math.sqrt(spread) if spread > 0 else 0.0
    return LogprobError(worst=float(diff.max()), mean=float(diff.mean()), surprise_z=z)


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
