"""Rollout verification: every batch is checked before it can be trained on or credited.

``check_batch`` runs the checks in a fixed order and returns the first failure
as a named reason (sent back in the receipt), or ``None`` if the batch passes.
Schema and size were already enforced by the codec.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_learner.ledger import Ledger
from echo_learner.rounds import Round
from protocol.errors import SignatureError
from protocol.identity import verify
from protocol.messages import RolloutBatch

# Receipt reasons. Stable strings: nodes and the status page show them.
ACCEPTED = "ok"
BAD_SIGNATURE = "bad_signature"
WRONG_SIGNER = "wrong_signer"
WRONG_JOB = "wrong_job"
NOT_ASSIGNED = "not_assigned"
STALE_VERSION = "stale_version"
REPLAYED = "replayed_nonce"
BAD_GROUP = "bad_group_size"
BAD_TOKENS = "bad_tokens"


@dataclass(frozen=True)
class Limits:
    job_id: str
    vocab_size: int
    group_size: int
    max_new_tokens: int


def check_batch(
    batch: RolloutBatch, sender: str, round_: Round | None, ledger: Ledger, limits: Limits
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
    if round_ is None or batch.version != round_.version:
        # Sync mode: only rollouts of the version being trained are useful.
        return STALE_VERSION
    prompt_ids = [g.prompt_id for g in batch.groups]
    if len(set(prompt_ids)) != len(prompt_ids):
        return NOT_ASSIGNED
    if any(round_.assigned_to(sender, pid) is None for pid in prompt_ids):
        return NOT_ASSIGNED
    if ledger.nonce_accepted(sender, batch.nonce):
        return REPLAYED
    for group in batch.groups:
        if len(group.completions) != limits.group_size:
            return BAD_GROUP
        for c in group.completions:
            if len(c.tokens) != len(c.logprobs) or not 0 < len(c.tokens) <= limits.max_new_tokens:
                return BAD_TOKENS
            if any(t >= limits.vocab_size for t in c.tokens):
                return BAD_TOKENS
    return None
