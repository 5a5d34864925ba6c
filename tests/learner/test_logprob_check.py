"""The log-prob check never rejects an honest node and always catches a forger.

Real parts: the learner's default model at several versions, the node's torch
backend sampling from the published weights, the learner's recompute.
"""

import dataclasses
import random

import pytest
import torch

from echo_learner.training.logprobs import grouped_logprobs
from echo_learner.training.model import ModelShape, build_model, config_json
from echo_learner.training.trainer import Objective, Trainer
from echo_learner.verify.recompute import logprob_error
from echo_learner.verify.tolerance import TOLERANCE, tolerance
from echo_learner.verify.verifier import BAD_LOGPROBS, IMPLAUSIBLE, check_logprobs
from echo_node.backend_torch import TorchBackend
from protocol.messages import UNSIGNED
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup
from tests.protocol.samples import NODE

GROUP = 16
PROMPTS_PER_BATCH = 4


def versions(n):
    """Policies that differ like successive versions do, sharpened so some
    tokens are near-certain and others unlikely (the hard cases for a tolerance)."""
    for seed in range(n):
        model = build_model(ModelShape(seed=seed))
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 + seed)
        yield model.eval()


def sample_batches(model, rng, batches, max_new_tokens, temperature=1.0, prompts_per_batch=PROMPTS_PER_BATCH):
    backend = TorchBackend(threads=1)
    trainer = Trainer(model, lr=0.0, objective=Objective(0.2, 3.0, 0.0), pad_id=256)
    backend.load(config_json(model), trainer.weights())
    for _ in range(batches):
        prompts = [
            (257, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 12))), 61) for _ in range(prompts_per_batch)
        ]
        groups = backend.generate(prompts, GROUP, max_new_tokens, temperature, (258,))
        batch = RolloutBatch(
            "reverse-test",
            0,
            NODE.peer_id_str,
            b"n" * 16,
            "torch",
            "f32",
            "cpu",
            1,
            tuple(RolloutGroup(i, tuple(Completion(s.tokens, s.logprobs) for s in g)) for i, g in enumerate(groups)),
            UNSIGNED,
        )
        yield prompts, batch


@pytest.mark.heavy  # a sweep of thousands of rollouts (12.5 s on 2 cores, 2026-11-29)
def test_thousands_of_honest_rollouts_have_zero_false_rejects():
    rng = random.Random(0)
    rollouts, worst, most_z = 0, 0.0, 0.0
    for model in versions(3):
        for prompts, batch in sample_batches(model, rng, batches=12, max_new_tokens=24):
            error = logprob_error(model, prompts, batch, pad_id=256)
            worst = max(worst, error.worst)
            most_z = max(most_z, abs(error.surprise_z))
            assert check_logprobs(error, tolerance("torch", "f32")) is None, error
            rollouts += sum(len(g.completions) for g in batch.groups)
    assert rollouts >= 2000
    print(f"honest rollouts {rollouts}, worst |node - learner| log-prob {worst:.2e}, |z| {most_z:.2f}")
    assert worst < tolerance("torch", "f32").worst / 10  # a wide margin, not a near miss
    assert most_z < tolerance("torch", "f32").z / 2


@pytest.mark.heavy  # 1,500 recomputes: the rare tokens need that many to show
def test_a_peaked_policy_s_rare_honest_tokens_are_not_refused():
    """Late in training the policy is nearly deterministic; now and then a
    node honestly samples a token of probability 1e-4 or less. Scored as a
    normal z, one such token in a one-prompt batch passed |z| > 8 (4 of these
    1,500 batches; 2 honest batches refused in a 500-step sync run)."""
    model = build_model()
    with torch.no_grad():
        model.model.norm.weight.mul_(12.0)  # sharper logits: entropy ~0.001 nats a token
    model.eval()
    allowed = tolerance("torch", "f32")
    batches, most_z = 0, 0.0
    for prompts, batch in sample_batches(model, random.Random(0), 1500, max_new_tokens=4, prompts_per_batch=1):
        error = logprob_error(model, prompts, batch, pad_id=256)
        assert check_logprobs(error, allowed) is None, (batches, error)
        most_z = max(most_z, abs(error.surprise_z))
        batches += 1
    print(f"peaked policy: {batches} one-prompt batches, |z| at most {most_z:.2f}")
    assert most_z < allowed.z / 2


def test_rollouts_sampled_at_the_jobs_temperature_verify_at_it_and_only_at_it():
    """--temperature 0.7: nodes sample from softmax(logits / 0.7) and report
    its log-probs; the learner recomputes at 0.7. Recomputed at 1, the same
    honest rollouts would be refused: the temperature is really in force."""
    model = next(versions(1))
    rng = random.Random(6)
    for prompts, batch in sample_batches(model, rng, batches=3, max_new_tokens=16, temperature=0.7):
        allowed = tolerance("torch", "f32")
        assert check_logprobs(logprob_error(model, prompts, batch, pad_id=256, temperature=0.7), allowed) is None
        assert check_logprobs(logprob_error(model, prompts, batch, pad_id=256), allowed) == BAD_LOGPROBS


def test_forged_logprobs_are_caught():
    model = next(versions(1))
    prompts, honest = next(sample_batches(model, random.Random(1), 1, max_new_tokens=8))
    group = honest.groups[0]
    first = group.completions[0]

    def forge(completion):
        return dataclasses.replace(
            honest, groups=(dataclasses.replace(group, completions=(completion, *group.completions[1:])),)
        )

    # Claiming a sampled token was less likely than it was inflates its
    # importance weight; claiming uniform log-probs hides the real policy.
    lowered = Completion(first.tokens, (first.logprobs[0] - 0.05, *first.logprobs[1:]))
    uniform = Completion(first.tokens, tuple(-5.56 for _ in first.tokens))
    for forged in (forge(lowered), forge(uniform)):
        error = logprob_error(model, prompts[:1], forged, pad_id=256)
        assert check_logprobs(error, tolerance("torch", "f32")) == BAD_LOGPROBS
    one_batch = logprob_error(model, prompts[:1], forge(first), pad_id=256)
    assert check_logprobs(one_batch, tolerance("torch", "f32")) is None


def test_many_small_shifts_are_caught_by_the_batch_mean():
    """A q8_0 node may be far off on a few tokens, but not on every token."""
    model = next(versions(1))
    prompts, honest = next(sample_batches(model, random.Random(2), 1, max_new_tokens=8))
    shifted = dataclasses.replace(
        honest,
        dtype="q8_0",
        groups=tuple(
            dataclasses.replace(
                g, completions=tuple(Completion(c.tokens, tuple(lp - 1.0 for lp in c.logprobs)) for c in g.completions)
            )
            for g in honest.groups
        ),
    )
    error = logprob_error(model, prompts, shifted, pad_id=256)
    assert error.worst < tolerance("llama", "q8_0").worst  # no single token gives it away
    assert check_logprobs(error, tolerance("llama", "q8_0")) == BAD_LOGPROBS
    one_token = dataclasses.replace(shifted, groups=honest.groups)
    assert check_logprobs(logprob_error(model, prompts, one_token, pad_id=256), tolerance("llama", "q8_0")) is None


def test_the_grouped_recompute_equals_the_full_one():
    """Verification shares each prompt's KV cache; training recomputes whole rows."""
    from echo_learner.training.logprobs import completion_logprobs, grouped_logprobs

    rng = random.Random(4)
    for model in versions(2):
        prompts = [(257, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 12))), 61) for _ in range(4)]
        groups = [
            [tuple(rng.randrange(0, 259) for _ in range(rng.randint(1, 20))) for _ in range(rng.randint(1, 16))]
            for _ in prompts
        ]
        grouped = grouped_logprobs(model, prompts, groups, pad_id=256)
        rows = [(p, c) for p, group in zip(prompts, groups) for c in group]
        with torch.no_grad():
            full, _ = completion_logprobs(model, [p for p, _ in rows], [c for _, c in rows], pad_id=256)
        flat = [lp for group in grouped for lp in group]
        assert [len(g) for g in grouped] == [len(g) for g in groups]
        for i, (p, c) in enumerate(rows):
            expected = full[i, len(p) - 1 : len(p) - 1 + len(c)]
            assert flat[i].shape == expected.shape
            assert (flat[i] - expected).abs().max() < 1e-5


def test_a_recompute_split_to_fit_its_memory_budget_gives_the_same_stats():
    """Long answers: the completions go through the model in several passes."""
    from echo_learner.training.logprobs import (
        VERIFY_BYTES_PER_LOGIT,
        completion_logprobs,
        grouped_token_stats,
        row_slices,
    )

    rng = random.Random(5)
    model = next(versions(1))
    prompts = [(257, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 8))), 61) for _ in range(3)]
    groups = [[tuple(rng.randrange(0, 259) for _ in range(rng.randint(1, 30))) for _ in range(6)] for _ in prompts]
    budget = 3 * 30 * model.config.vocab_size * VERIFY_BYTES_PER_LOGIT  # about three rows a pass
    assert (
        len(
            row_slices([len(c) - 1 for g in groups for c in g], model.config.vocab_size, budget, VERIFY_BYTES_PER_LOGIT)
        )
        >= 4
    )
    for temperature in (1.0, 0.7):
        whole = grouped_token_stats(model, prompts, groups, 256, temperature=temperature)
        split = grouped_token_stats(model, prompts, groups, 256, max_bytes=budget, temperature=temperature)
        for a, b in zip([s for g in whole for s in g], [s for g in split for s in g]):
            for x, y in ((a.logprobs, b.logprobs), (a.entropy, b.entropy), (a.variance, b.variance)):
                assert x.shape == y.shape and torch.allclose(x, y, atol=1e-4)  # variance: a difference of ~30s
        # And both are the log-softmax of the logits over the temperature.
        rows = [(p, c) for p, g in zip(prompts, groups) for c in g]
        with torch.no_grad():
            full, _ = completion_logprobs(model, [p for p, _ in rows], [c for _, c in rows], 256, temperature)
        for i, (p, c) in enumerate(rows):
            stats = split[i // 6][i % 6]
            assert (stats.logprobs - full[i, len(p) - 1 : len(p) - 1 + len(c)]).abs().max() < 1e-5


def test_row_slices_keep_every_row_once_and_under_the_budget():
    from echo_learner.training.logprobs import row_slices

    widths = [5, 1, 9, 9, 2, 40, 3]
    slices = row_slices(widths, vocab=10, max_bytes=10 * 20 * 4, bytes_per_logit=4)
    assert [i for s in slices for i in range(len(widths))[s]] == list(range(len(widths)))
    for s in slices:
        rows = widths[s]
        assert len(rows) == 1 or len(rows) * max(rows) * 10 * 4 <= 10 * 20 * 4
    assert widths[slices[-2]] == [40]  # too wide for the budget on its own: a pass of its own
    assert row_slices([], 10, 100, 4) == []


def _exact(model, prompts, groups, template):
    """A batch of ``groups`` of token tuples with the learner's own log-probs:
    what a forger who computes them with the published weights reports."""
    lps = grouped_logprobs(model, prompts, groups, pad_id=256)
    return dataclasses.replace(
        template,
        groups=tuple(
            RolloutGroup(i, tuple(Completion(tuple(t), tuple(float(x) for x in lp)) for t, lp in zip(g, gl)))
            for i, (g, gl) in enumerate(zip(groups, lps))
        ),
    )


def test_tokens_not_sampled_from_the_policy_are_caught_even_with_exact_logprobs():
    # A sharpened policy, as after training: near-certain tokens and unlikely
    # ones. (Under a near-uniform policy any token is nearly as likely as a
    # sampled one, and nothing needs catching.)
    *_, other_model, honest_model = versions(3)
    rng = random.Random(5)
    prompts, honest = next(sample_batches(honest_model, rng, 1, max_new_tokens=16))
    shape = [[len(c.tokens) for c in g.completions] for g in honest.groups]
    # Chosen by hand (here at random), sampled from another model, or greedy.
    chosen = [[tuple(rng.randrange(0, 256) for _ in range(n)) for n in g] for g in shape]
    _, other = next(sample_batches(other_model, rng, 1, max_new_tokens=16))
    swapped = [[c.tokens for c in g.completions] for g in other.groups]
    greedy = []
    for p, g in zip(prompts, shape):
        with torch.no_grad():
            out = honest_model.generate(torch.tensor([p]), max_new_tokens=max(g), do_sample=False, pad_token_id=256)[
                0, len(p) :
            ]
        greedy.append([tuple(out[:n].tolist()) for n in g])
    for forged in (chosen, swapped, greedy):
        batch = _exact(honest_model, prompts, forged, honest)
        error = logprob_error(honest_model, prompts, batch, pad_id=256)
        assert error.worst < tolerance("torch", "f32").worst  # the log-probs themselves are right
        for kind, allowed in TOLERANCE.items():  # however loose the declared kind's tolerance
            assert check_logprobs(error, allowed) == IMPLAUSIBLE, (kind, error)
    honest_error = logprob_error(honest_model, prompts, honest, pad_id=256)
    assert check_logprobs(honest_error, tolerance("torch", "f32")) is None


def test_length_buckets_hold_every_row_once_and_bound_their_padding():
    from echo_learner.training.logprobs import length_buckets

    rng = random.Random(6)
    for _ in range(200):
        lengths = [rng.choice([rng.randint(1, 20), 64]) for _ in range(rng.randint(1, 16))]
        buckets = length_buckets(lengths, slack=1.25)
        assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
        for b in buckets:
            width = max(lengths[i] for i in b)
            assert len(b) == 1 or len(b) * width <= 1.25 * sum(lengths[i] for i in b)
        assert len(length_buckets([64] * 8)) == 1  # alike: one batch
