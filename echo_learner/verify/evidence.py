"""Evidence per peer: does a node generate the way it declares, judged over all its batches.

One batch proves little. A node running Q5_0 while declaring q8_0, or sampling
with llama.cpp's chat defaults, or at 0.5 where the job says 0.7, sends
batches that each pass the per-batch bounds (``echo_learner.verify.tolerance``); what
gives it away is that its batches keep leaning the same way. So for each peer
and the (backend, dtype, device) it declares, the learner runs sequential
tests (CUSUM: each statistic adds what a batch says for a specific way of
cheating and against honesty, never drops below 0, and refuses the peer
when it passes its limit):

- **precision**: how far the node's log-probs are from the f32 recompute,
  against how far the declared arithmetic is on the same tokens
  (``echo_learner.verify.emulate``). Honest nodes land at 0.9-1.2 times the
  emulation's distance, cheaper quantisations at 3-9 times.
- **hotter, colder**: the likelihood ratio of each sampled token under the
  policy tilted to p^(1-d) (a higher or lower temperature) against the
  policy itself.
- **tail**: tokens from the distribution's tail (beyond top-k 40 / top-p
  0.95) come as often as the tail's mass says; a truncating sampler never
  draws them.
- **concentrated**: tokens whose surprise is always about the entropy (a
  forger who aims at an unremarkable z-score).
- **duplicates**: a group's repeated completions, against the chance of the
  repeat under the policy (copied or greedy groups).
- **selected** (``echo_learner.verify.selection``): a peer's groups scoring better
  than other peers' groups of the same and recent versions (the best of several groups sent).

The sampler tests add exact log-likelihood ratios: for a node that samples
as asked, each is a random walk with negative drift, and a limit of h nats is
crossed with chance below e^-h per batch. The limits (``EvidenceLimits``)
and what each cheater needs to be caught are in docs/learner.md, measured by
``bench/cheaters.py``.

A caught peer is refused from then on, each batch a strike, and forfeits
all its credit (``Ledger.forfeit``): evidence accumulates over batches the
learner accepted, so those batches are the suspect ones.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field

from echo_learner.verify.selection import RewardReference

# Receipt reasons (stable strings, like echo_learner.verify.verifier's).
PRECISION_MISMATCH = "precision_mismatch"  # log-probs of a cheaper model than declared
SAMPLER_MISMATCH = "sampler_mismatch"  # tokens not drawn as the assignment asks
SELECTED_GROUPS = "selected_groups"  # groups chosen for their rewards
REASONS = (PRECISION_MISMATCH, SAMPLER_MISMATCH, SELECTED_GROUPS)


@dataclass(frozen=True, kw_only=True)
class BatchEvidence:
    """What one batch says about how its node generates: sums over its
    sampled tokens (log-likelihood ratios in nats), made in the recompute."""

    tokens: int = 0
    groups: int = 0
    reported_off: float = 0.0  # sum of |reported - recomputed| log-probs
    signed_off: float = 0.0  # sum of reported - recomputed
    far_off: int = 0  # tokens more than FAR_OFF from the recompute
    surprise: float = 0.0  # sum of (surprise - entropy): an honest sampler's averages 0
    surprise_var: float = 0.0  # sum of the variances of the surprise
    emulated_off: float | None = None  # the same for the declared arithmetic (None: not emulated)
    hotter: float = 0.0
    colder: float = 0.0
    tail: float = 0.0
    concentrated: float = 0.0
    duplicates: float = 0.0  # over groups with repeats: -ln(the chance of those repeats)


@dataclass(frozen=True, kw_only=True)
class EvidenceLimits:
    """When a test refuses a peer. Defaults from bench/cheaters.py and
    bench/plausibility.py (docs/learner.md, "Evidence per peer")."""

    # An emulated batch adds (tokens) x (its distance / the emulation's - ratio):
    # honest batches measured 0.83-1.12 on nine models, so honest peers drift
    # down fast; a LoRA adapter dropped early in training is ~1.4 times as far.
    precision_ratio: float = 1.5
    # Per token: rounding every backend has, even in f32 (kernels sum in other orders).
    precision_slack: float = 2e-4
    precision_limit: float = 256.0  # in tokens
    # Exact log-likelihood ratios: crossed by an honest sampler with chance < e^-limit.
    sampler_limit: float = 15.0
    # Repeated completions: a group's repeats count once rarer than e^-allowance.
    duplicate_allowance: float = 2.0
    # Selected groups (echo_learner.verify.selection): a log-likelihood ratio, as the
    # sampler tests', with a higher limit: each group weighs little (the best
    # of 8 groups adds ~0.2 nats a group where prompts are solved 2 times in
    # 10, several times that where half are), and a false catch costs an
    # honest peer its credit, so the limit is set for a whole swarm's groups:
    # crossed by an honest peer's with chance below e^-14 per group.
    reward_limit: float = 14.0
    # Emulated recomputes: every batch until a peer has had this many, then a
    # random share of them (each costs a second forward pass).
    precision_probation: int = 8
    precision_share: float = 0.25


SAMPLER_TESTS = ("hotter", "colder", "tail", "concentrated", "duplicates")
FAR_OFF = 0.1  # nats: what counts a token as far from the recompute, for people


@dataclass
class RowEvidence:
    """One peer's evidence for one declared (backend, dtype, device): the
    tests' statistics, and running sums for people to read (the API's
    ``/api/peers``)."""

    batches: int = 0
    emulated: int = 0
    tokens: int = 0
    precision: float = 0.0
    sampler: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SAMPLER_TESTS, 0.0))
    selected: float = 0.0
    sums: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            ("reported_off", "signed_off", "far_off", "surprise", "surprise_var"), 0.0
        )
    )

    def count(self, batch: BatchEvidence) -> None:
        self.batches += 1
        self.tokens += batch.tokens
        for k in self.sums:
            self.sums[k] += getattr(batch, k)

    def to_json(self) -> dict:
        n, s = max(self.tokens, 1), self.sums
        return {
            "batches": self.batches,
            "emulated": self.emulated,
            "tokens": self.tokens,
            "mean_off": round(s["reported_off"] / n, 6),
            "signed_off": round(s["signed_off"] / n, 6),
            "far_off_share": round(s["far_off"] / n, 4),
            "surprise_z": round(s["surprise"] / math.sqrt(s["surprise_var"]), 2) if s["surprise_var"] > 0 else 0.0,
            "tests": {
                "precision": round(self.precision, 1),
                **{k: round(v, 2) for k, v in self.sampler.items()},
                "selected": round(self.selected, 2),
            },
        }


class EvidenceBook:
    """Every peer's evidence (bounded: the least recently used rows are
    forgotten past ``max_rows``) and the peers caught (loaded from the
    ledger's forfeits: a caught peer stays caught across restarts)."""

    def __init__(self, limits: EvidenceLimits, *, max_peers: int, caught: dict[str, str] | None = None):
        self.limits = limits
        self.max_peers = max_peers
        # peer -> its evidence per declared row; least recently used first.
        self.peers: OrderedDict[str, dict[tuple[str, str, str], RowEvidence]] = OrderedDict()
        self.caught: dict[str, str] = dict(caught or {})
        self.rewards = RewardReference()
        self.rng = random.Random()

    def row(self, peer: str, declared: tuple[str, str, str]) -> RowEvidence:
        rows = self.peers.get(peer)
        if rows is None:
            rows = self.peers[peer] = {}
            while len(self.peers) > self.max_peers:
                self.peers.popitem(last=False)
        self.peers.move_to_end(peer)
        return rows.setdefault(declared, RowEvidence())

    def wants_emulation(self, peer: str, declared: tuple[str, str, str]) -> bool:
        """Should this batch also be recomputed in its declared arithmetic?"""
        seen = self.peers.get(peer, {}).get(declared)
        if seen is None or seen.emulated < self.limits.precision_probation:
            return True
        return self.rng.random() < self.limits.precision_share

    def add(self, peer: str, declared: tuple[str, str, str], batch: BatchEvidence) -> str | None:
        """Count ``batch``'s evidence for ``peer`` declaring ``declared``: the
        reason to refuse the peer from now on, or None."""
        limits, row = self.limits, self.row(peer, declared)
        row.count(batch)
        if batch.emulated_off is not None:
            row.emulated += 1
            row.precision = max(0.0, row.precision + precision_step(batch, limits))
        steps = {test: getattr(batch, test) for test in SAMPLER_TESTS}
        steps["duplicates"] -= limits.duplicate_allowance * batch.groups
        for test, step in steps.items():
            row.sampler[test] = max(0.0, row.sampler[test] + step)
        if row.precision > limits.precision_limit:
            return self.catch(peer, PRECISION_MISMATCH)
        if max(row.sampler.values()) > limits.sampler_limit:
            return self.catch(peer, SAMPLER_MISMATCH)
        return None

    def add_rewards(
        self,
        peer: str,
        declared: tuple[str, str, str],
        version: int,
        groups: list[list[float]],
        twins: list[int | None],
    ) -> dict[str, str]:
        """Count the rewards of ``peer``'s accepted groups of ``version`` (each
        a list of its completions' rewards; the twin pair each belongs to, or
        None): the peers caught by them (a completed pair weighs the other
        peer's group too), each with its reason."""
        caught = {}
        for group, ratio in self.rewards.likelihood_ratios(peer, declared, version, groups, twins):
            row = self.row(group.peer, group.row)
            row.selected = max(0.0, row.selected + ratio)
            if row.selected > self.limits.reward_limit and group.peer not in self.caught:
                caught[group.peer] = self.catch(group.peer, SELECTED_GROUPS)
        return caught

    def catch(self, peer: str, reason: str) -> str:
        self.caught.setdefault(peer, reason)
        return self.caught[peer]

    def of(self, peer: str) -> list[dict]:
        """``peer``'s evidence, per declared row, for the API."""
        rows = self.peers.get(peer, {})
        return [{"backend": b, "dtype": d, "device": v, **row.to_json()} for (b, d, v), row in rows.items()]


def precision_step(batch: BatchEvidence, limits: EvidenceLimits) -> float:
    """What an emulated batch adds to the precision test, in tokens: positive
    when its log-probs are more than ``precision_ratio`` times as far from the
    recompute as the declared arithmetic's are."""
    assert batch.emulated_off is not None
    scale = max(batch.emulated_off / max(batch.tokens, 1), limits.precision_slack)
    excess = batch.reported_off - limits.precision_ratio * batch.emulated_off - limits.precision_slack * batch.tokens
    return excess / scale


def duplicate_surprise(group_size: int, repeats: int, logprob: float) -> float:
    """-ln of (an upper bound on) the chance that ``repeats`` of
    ``group_size`` samples are one completion whose log-prob is ``logprob``:
    C(n, k) p^(k - 1)."""
    ways = math.lgamma(group_size + 1) - math.lgamma(repeats + 1) - math.lgamma(group_size - repeats + 1)
    return max(0.0, -(ways + (repeats - 1) * logprob))
