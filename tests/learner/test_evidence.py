"""Evidence per peer: honest nodes are never caught, however many batches
they send; nodes that sample otherwise than asked are, within a bounded
number of batches, whichever test catches them, with exact log-probs.

Real parts: the learner's model at several versions, the node's torch
backend (honest), transformers' own samplers for the cheats (top-k/top-p,
other temperatures, greedy), the learner's recompute and evidence book.
"""

import dataclasses
import random

import pytest
import torch

from echo_learner.swarm.rollout_handler import credited_tokens
from echo_learner.training.logprobs import grouped_logprobs
from echo_learner.training.model import build_model
from echo_learner.verify.evidence import (
    PRECISION_MISMATCH,
    SAMPLER_MISMATCH,
    SELECTED_GROUPS,
    BatchEvidence,
    EvidenceBook,
    EvidenceLimits,
)
from echo_learner.verify.recompute import logprob_error
from echo_learner.verify.selection import RewardReference, beta_of
from echo_learner.verify.tolerance import tolerance
from echo_learner.verify.verifier import check_logprobs
from protocol.messages import UNSIGNED
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup
from tests.learner.test_logprob_check import GROUP, sample_batches, versions
from tests.protocol.samples import NODE

PAD, EOS = 256, 258
DECLARED = ("torch", "f32", "cpu")


def book(**limits) -> EvidenceBook:
    return EvidenceBook(EvidenceLimits(**limits), max_peers=100)


def judge_until_caught(model, book, batches, declared=DECLARED):
    """Feed ``batches`` to ``book`` as one peer's: how many it took to catch
    the peer and why (None, None: never caught), and how many of them the
    per-batch checks alone would have refused."""
    refused = 0
    for n, (prompts, batch) in enumerate(batches, start=1):
        error = logprob_error(model, prompts, batch, PAD)
        refused += check_logprobs(error, tolerance(*declared)) is not None
        reason = book.add(NODE.peer_id_str, declared, error.evidence)
        if reason is not None:
            return n, reason, refused
    return None, None, refused


def as_batch(prompts, groups):
    return RolloutBatch(
        "evidence-test", 0, NODE.peer_id_str, b"n" * 16, "torch", "f32", "cpu", 1,
        tuple(RolloutGroup(i, tuple(Completion(t, lp) for t, lp in g)) for i, g in enumerate(groups)), UNSIGNED,
    )  # fmt: skip


def prompts_for(rng, n=1):
    return [(257, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 8))), 61) for _ in range(n)]


def cheat_batches(model, rng, batches, *, sampler=None, pick=None, max_new_tokens=6):
    """Batches whose tokens come from ``model.generate(**sampler)`` (or, given
    ``pick(logprobs_row) -> token``, one token at a time), each reported with
    its exact log-prob at the job's temperature (1): only the tokens can
    give them away."""
    torch.manual_seed(rng.randrange(2**31))
    for _ in range(batches):
        prompts = prompts_for(rng)
        groups = []
        for p in prompts:
            rows = []
            for _ in range(GROUP):
                ids = torch.tensor([p])
                with torch.no_grad():
                    if pick is None:
                        out = model.generate(
                            ids, max_new_tokens=max_new_tokens, pad_token_id=PAD, eos_token_id=EOS, **sampler
                        )
                        rows.append(tuple(out[0, len(p) :].tolist()))
                        continue
                    for _ in range(max_new_tokens):
                        lp = torch.log_softmax(model(ids).logits[0, -1], -1)
                        ids = torch.cat([ids, torch.tensor([[pick(lp)]])], dim=1)
                        if ids[0, -1] == EOS:
                            break
                rows.append(tuple(ids[0, len(p) :].tolist()))
            groups.append(rows)
        exact = grouped_logprobs(model, prompts, groups, PAD)
        yield (
            prompts,
            as_batch(prompts, [[(t, tuple(lp.tolist())) for t, lp in zip(g, e)] for g, e in zip(groups, exact)]),
        )


def z_forged(lp):
    """The token whose surprise is nearest the entropy."""
    entropy = -(lp.exp() * lp).sum()
    return int((-lp - entropy).abs().argmin())


def sharp():
    """A trained-looking policy: some tokens near-certain, others not."""
    return list(versions(3))[1]


@pytest.mark.heavy  # a sweep of ~3,000 rollouts (10.9 s on 2 cores, 2026-11-29)
def test_thousands_of_honest_rollouts_are_never_caught():
    rng, evidence = random.Random(0), book()
    rollouts = 0
    for model in versions(3):
        for prompts, batch in sample_batches(model, rng, batches=15, max_new_tokens=16):
            error = logprob_error(model, prompts, batch, PAD)
            assert evidence.add(NODE.peer_id_str, DECLARED, error.evidence) is None
            rollouts += sum(len(g.completions) for g in batch.groups)
    row = evidence.row(NODE.peer_id_str, DECLARED)
    print(f"honest: {rollouts} rollouts, {row.tokens} tokens, evidence {row.to_json()}")
    assert rollouts >= 2800 and max(row.sampler.values()) < EvidenceLimits().sampler_limit / 2


@pytest.mark.heavy  # a sweep of a peaked policy's rare tokens (19.6 s on 2 cores, 2026-11-29)
def test_a_peaked_policy_s_rare_honest_tokens_are_never_caught():
    """Late in training: entropy ~0.001 nats a token, and now and then a
    token of probability 1e-4. Rare tokens are what exact likelihood ratios
    expect; one-prompt batches by the hundred do not add up to a catch."""
    model = build_model()
    with torch.no_grad():
        model.model.norm.weight.mul_(12.0)
    model.eval()
    evidence = book()
    for prompts, batch in sample_batches(model, random.Random(0), 400, max_new_tokens=4, prompts_per_batch=1):
        error = logprob_error(model, prompts, batch, PAD)
        assert evidence.add(NODE.peer_id_str, DECLARED, error.evidence) is None
    print(f"peaked: {evidence.row(NODE.peer_id_str, DECLARED).to_json()}")


@pytest.mark.parametrize(
    "cheat, how, most",
    [
        ("chat sampler (top-k 40, top-p 0.95)", dict(sampler=dict(do_sample=True, top_k=40, top_p=0.95)), 8),
        ("hotter (1.3 for 1.0)", dict(sampler=dict(do_sample=True, temperature=1.3, top_k=0)), 24),
        ("colder (0.7 for 1.0)", dict(sampler=dict(do_sample=True, temperature=0.7, top_k=0)), 24),
        ("greedy", dict(sampler=dict(do_sample=False)), 2),
        ("z-forged", dict(pick=z_forged), 2),
    ],
)
def test_a_node_sampling_otherwise_than_asked_is_caught(cheat, how, most):
    model = sharp()
    n, reason, refused = judge_until_caught(model, book(), cheat_batches(model, random.Random(1), 32, **how))
    print(f"{cheat}: caught after {n} batches of 1 prompt x {GROUP} x 6 tokens, {refused} refused by per-batch checks")
    assert reason == SAMPLER_MISMATCH and n <= most


def test_copied_completions_are_caught_and_credited_once():
    """One honest completion sent as the whole group: each copy is a fair
    sample, together they are not."""
    model = sharp()
    rng = random.Random(2)

    def copied():
        for prompts, honest in sample_batches(model, rng, 8, max_new_tokens=12):
            groups = tuple(dataclasses.replace(g, completions=(g.completions[0],) * GROUP) for g in honest.groups)
            yield prompts, dataclasses.replace(honest, groups=groups)

    n, reason, _ = judge_until_caught(model, book(), copied())
    assert reason == SAMPLER_MISMATCH and n == 1
    prompts, batch = next(copied())
    assert credited_tokens(batch) == sum(len(g.completions[0].tokens) for g in batch.groups)


def precision(reported_off, emulated_off, tokens=300):
    return BatchEvidence(tokens=tokens, groups=1, reported_off=reported_off, emulated_off=emulated_off)


def test_precision_is_judged_against_the_declared_arithmetic():
    """Honest nodes measured 0.85-1.16 times the emulation's distance
    (SmolLM2, docs/learner.md); a cheaper quantisation 3-9 times."""
    honest, cheap = book(), book()
    rng = random.Random(3)
    for _ in range(500):
        off = rng.uniform(1, 30)
        assert honest.add("honest", ("llama", "q8_0", "cpu"), precision(off * rng.uniform(0.85, 1.16), off)) is None
    caught = [cheap.add("cheap", ("llama", "q8_0", "cpu"), precision(off * 3.1, off)) for off in (20, 20, 20)]
    assert caught == [PRECISION_MISMATCH] * 3 and cheap.caught == {"cheap": PRECISION_MISMATCH}
    # Half as far again as the emulation, batch after batch (an adapter dropped
    # early in training): caught within a few batches of 300 tokens.
    near = book()
    reasons = [near.add("near", ("llama", "q8_0", "cpu"), precision(1.8 * 20, 20)) for _ in range(4)]
    assert reasons[-1] == PRECISION_MISMATCH
    # Batches not recomputed in the declared arithmetic say nothing of precision.
    unchecked = book()
    assert all(unchecked.add("p", ("llama", "q8_0", "cpu"), precision(90, None)) is None for _ in range(50))


def test_emulation_is_asked_for_every_batch_in_probation_then_for_a_share():
    evidence = book(precision_probation=3, precision_share=0.25)
    evidence.rng = random.Random(4)
    declared = ("llama", "q8_0", "cpu")
    asked = []
    for _ in range(400):
        asked.append(evidence.wants_emulation("p", declared))
        evidence.add("p", declared, precision(10, 10 if asked[-1] else None))
    assert asked[:3] == [True] * 3 and 0.15 < sum(asked[3:]) / 397 < 0.35


def sums_prompts(seed):
    """Groups of 8 for prompts as SmolLM2's two-term sums: each has its own
    chance of being solved, mostly low (Beta(0.45, 1.9), fitted to 192 of
    its groups). ``group(chance, tries)``: the best of ``tries`` groups."""
    rng = random.Random(seed)

    def chance():
        return rng.betavariate(0.45, 1.9)

    def group(p=None, tries=1):
        p = chance() if p is None else p
        draws = [[float(rng.random() < p) for _ in range(8)] for _ in range(tries)]
        return max(draws, key=sum)

    return chance, group


def test_groups_chosen_for_their_rewards_are_caught():
    """Every peer's prompts are drawn alike: the best of 8 groups solves more
    than the others' groups of the same version, batch after batch, an honest
    peer's only by chance."""
    _, group = sums_prompts(5)
    evidence = book()
    caught = []
    for batch in range(1, 1000):
        version = batch // 8
        evidence.add_rewards("honest", DECLARED, version, [group(), group()], [None, None])
        if evidence.add_rewards("cheat", DECLARED, version, [group(tries=8), group(tries=8)], [None, None]):
            caught.append(batch)
        evidence.add_rewards("honest2", DECLARED, version, [group(), group()], [None, None])
    print(f"best of 8: caught after {caught[0]} batches of two groups; honest peers' evidence:",
          evidence.row("honest", DECLARED).selected, evidence.row("honest2", DECLARED).selected)  # fmt: skip
    # Each group weighs ~0.2 nats here (the likelihood ratio's mean under the
    # best of 8), once a version has 16 other groups: ~100 groups to the limit.
    assert evidence.caught == {"cheat": SELECTED_GROUPS} and caught[0] <= 120
    # Too few other groups of the version, or all scoring alike: nothing is weighed.
    reference = RewardReference()
    for version in range(6):
        reference.likelihood_ratios("other", DECLARED, version, [group(), group(), group()], [None] * 3)
    assert reference.likelihood_ratios("p", DECLARED, 6, [group()], [None]) == []
    for i in range(20):
        reference.likelihood_ratios(f"o{i}", DECLARED, 7, [[0.0] * 8], [None])
    assert reference.likelihood_ratios("p", DECLARED, 7, [[1.0] * 8], [None]) == []
    # Groups that spread less than binomial counts fit no surer a beta than
    # their number (a + b = 16 here, not 999: a mean known to +-0.12).
    assert beta_of([(4, 8), (3, 8)] * 8) == (7.0, 9.0)


def test_twins_side_by_side_catch_the_best_of_8_in_a_swarm_of_two():
    """Two peers, no third to compare with: only twins (one prompt handed to
    both) weigh anything, each group against the other's count."""
    chance, group = sums_prompts(6)
    evidence = book()
    caught, twin = [], 0
    for batch in range(1, 200):
        p = chance()
        twin += 1
        # Half the prompts are twins, their first with either peer.
        first, second = ("honest", "cheat") if batch % 2 else ("cheat", "honest")
        for peer in (first, second):
            if evidence.add_rewards(peer, DECLARED, batch // 4, [group(p, 8 if peer == "cheat" else 1)], [twin]):
                caught.append(batch)
        evidence.add_rewards("honest", DECLARED, batch // 4, [group()], [None])
        evidence.add_rewards("cheat", DECLARED, batch // 4, [group(tries=8)], [None])
    print(f"best of 8, side by side: caught after {caught[0]} pairs", evidence.row("honest", DECLARED).selected)
    assert evidence.caught == {"cheat": SELECTED_GROUPS} and caught[0] <= 64

    # Two honest peers, thousands of pairs: never caught.
    honest = book()
    for twin in range(3000):
        p = chance()
        honest.add_rewards("a", DECLARED, twin // 8, [group(p)], [twin])
        honest.add_rewards("b", DECLARED, twin // 8, [group(p)], [twin])
    assert honest.caught == {} and max(honest.row(p, DECLARED).selected for p in "ab") < 10

    # A pair weighs nothing when one peer answered both, or they were made with other versions.
    reference = RewardReference()
    assert reference.likelihood_ratios("a", DECLARED, 0, [[1.0] * 8, [0.0] * 8], [1, 1]) == []
    assert reference.likelihood_ratios("a", DECLARED, 0, [[1.0] * 8], [2]) == []
    assert reference.likelihood_ratios("b", DECLARED, 1, [[1.0] * 8], [2]) == []
    reference.likelihood_ratios("a", DECLARED, 3, [[1.0] * 8], [3])
    (first, r1), (second, r2) = reference.likelihood_ratios("b", DECLARED, 3, [[0.0] * 8], [3])
    assert (first.peer, second.peer) == ("a", "b") and r1 > 0 > r2
