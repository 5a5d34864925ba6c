"""Training packs a step's groups, each prompt once, into few passes
(echo_learner/training/packing.py): the log-probs and the gradient must be
those of whole rows, for every model family (sliding windows, softcapping,
eager and sdpa attention), and a pass stays within its memory budget."""

import math
import random

import pytest
import torch

from echo_learner.training.logprobs import completion_logprobs
from echo_learner.training.model import build_model
from echo_learner.training.packing import PACK_TOKENS, packed_logprobs, parts
from echo_learner.training.trainer import Objective, Passes, ScoredGroup, Trainer
from tests.families import FAMILIES, tiny_model


def groups_of(rng: random.Random, n_groups: int, size: int, longest: int) -> tuple[list, list]:
    """Rows (prompt, completion) of ``n_groups`` groups; completions up to
    ``longest`` tokens (past Gemma's window of 8 in tests/families.py)."""
    prompts, completions = [], []
    for _ in range(n_groups):
        prompt = tuple(rng.randrange(0, 250) for _ in range(rng.randint(1, 14)))
        for _ in range(size):
            prompts.append(prompt)
            completions.append(tuple(rng.randrange(0, 250) for _ in range(rng.randint(1, longest))))
    return prompts, completions


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_groups_give_whole_rows_log_probs_and_gradient(family):
    rng = random.Random(3)
    model = tiny_model(family).train()
    prompts, completions = groups_of(rng, 3, 4, 24)
    weights = torch.randn(len(completions), 24)  # a loss that weighs every token differently

    def gradient(logprobs, mask):
        model.zero_grad()
        (logprobs * mask * weights[:, : logprobs.shape[1]]).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    packed, mask = packed_logprobs(model, prompts, completions, pad_id=0, temperature=0.7)
    packed_grad = gradient(packed, mask)
    full, _ = completion_logprobs(model, prompts, completions, pad_id=0, temperature=0.7)
    rows = [full[i, len(p) - 1 : len(p) - 1 + len(c)] for i, (p, c) in enumerate(zip(prompts, completions))]
    whole = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    assert torch.equal(mask.sum(1), torch.tensor([len(c) for c in completions], dtype=torch.float32))
    assert (packed - whole).mul(mask).abs().max() < 2e-5
    whole_grad = gradient(whole, mask)
    assert torch.allclose(packed_grad, whole_grad, atol=1e-4 * whole_grad.abs().max(), rtol=1e-4)


def test_a_step_is_few_passes_each_within_its_budget():
    rng = random.Random(4)
    prompts, completions = groups_of(rng, 16, 8, 64)
    vocab, budget = 259, 2**20
    found = parts(prompts, completions, vocab, budget)
    assert [i for s in found for i in range(s.start, s.stop)] == list(range(len(completions)))
    assert all(sum(len(c) for c in completions[s]) * vocab * 16 <= budget for s in found)
    total = sum(len(c) for c in completions) * vocab * 16
    assert len(found) <= 2 * math.ceil(total / budget)
    # One pass where the budget allows: 16 groups, not 16 prompt passes and their buckets.
    assert len(parts(prompts, completions, vocab, 2**30)) == 1
    # A pass's tokens (a group cut in two has its prompt in both) stay within PACK_TOKENS.
    prompt, rows = (1,) * 5, 10_000
    cut = parts([prompt] * rows, [(2, 3)] * rows, vocab, 2**40)
    assert len(cut) == 2 and all(len(prompt) + (s.stop - s.start) <= PACK_TOKENS for s in cut)


def test_training_in_bf16_autocast_keeps_f32_weights_and_nearly_the_loss():
    """On a GPU the learner trains under bf16 autocast (--train-precision):
    matmuls in bf16, weights, optimiser and loss in f32."""
    rng = random.Random(5)
    prompts, completions = groups_of(rng, 4, 8, 12)
    groups = [
        ScoredGroup(
            prompts[g * 8],
            tuple(completions[g * 8 : g * 8 + 8]),
            tuple((-5.0,) * len(c) for c in completions[g * 8 : g * 8 + 8]),
            tuple(rng.random() for _ in range(8)),
        )
        for g in range(4)
    ]
    objective = Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.0)
    losses = {}
    for precision in ("f32", "bf16"):
        model = build_model()
        trainer = Trainer(model, lr=1e-3, objective=objective, pad_id=256, passes=Passes(precision=precision))
        losses[precision] = trainer.step(groups).loss
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses["bf16"] != losses["f32"]  # bf16 arithmetic did run
    assert abs(losses["bf16"] - losses["f32"]) < 0.02 * abs(losses["f32"]) + 1e-3, losses
    with pytest.raises(ValueError, match="precision"):
        Passes(precision="fp8")
