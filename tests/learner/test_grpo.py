import pytest
import torch

from echo_learner.training.grpo import (
    clipped_surrogate,
    entropy_surrogate,
    group_advantages,
    kl_penalty,
    loss_denominator,
    loss_numerator,
)


def clipped_surrogate_loss(logp, behaviour, advantages, mask, clip_eps, ratio_cap=float("inf")):
    """The default loss (dapo): token-level ratios, the mean over the batch's tokens."""
    per_token = clipped_surrogate(logp - behaviour, advantages, clip_eps, ratio_cap)
    return loss_numerator(per_token, mask, "dapo") / mask.sum()


def test_advantages_are_group_normalised():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv = group_advantages(rewards)
    # TRL's scale: Bessel's standard deviation (0.577, not 0.5), plus 1e-4
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (0.5 * (4 / 3) ** 0.5 + 1e-4))
    assert torch.equal(adv[1], torch.zeros(4))  # a uniform group teaches nothing


def test_a_flat_group_below_the_step_s_mean_gets_its_standard_score_when_asked():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1 / 3] * 4, [1.0] * 4])
    plain = group_advantages(rewards)
    pushed = group_advantages(rewards, push_down_flat=True)
    assert torch.equal(plain[1:], torch.zeros(2, 4))
    assert torch.equal(pushed[0], plain[0])  # groups whose rewards differ: GRPO's own
    expected = (1 / 3 - rewards.mean()) / (rewards.std() + 1e-4)
    assert torch.allclose(pushed[1], expected.expand(4)) and expected < -0.5
    assert torch.equal(pushed[2], torch.zeros(4))  # flat at or above the mean: nothing to push


def test_loss_pushes_up_positive_advantage_tokens():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss = clipped_surrogate_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), 0.2)
    loss.backward()
    assert (logp.grad < 0).all()  # gradient descent raises these log-probs


def test_clipping_stops_the_gradient_beyond_the_trust_region():
    behaviour = torch.tensor([[-1.0]])
    logp = torch.tensor([[-0.5]], requires_grad=True)  # ratio e^0.5 > 1.2
    clipped_surrogate_loss(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 1), 0.2).backward()
    assert logp.grad.abs().sum() == 0


def test_mask_excludes_padding():
    logp = torch.tensor([[-1.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]])
    clipped_surrogate_loss(logp, logp.detach(), torch.tensor([2.0]), mask, 0.2).backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 0] != 0


def test_ratio_cap_truncates_large_ratios_with_negative_advantage():
    behaviour = torch.tensor([[-5.0]])
    logp = torch.tensor([[-1.0]], requires_grad=True)  # ratio e^4 ~ 55
    capped = clipped_surrogate_loss(logp, behaviour, torch.tensor([-1.0]), torch.ones(1, 1), 0.2, ratio_cap=3.0)
    assert capped.item() == pytest.approx(3.0)  # -(3 * -1)
    capped.backward()
    assert logp.grad.abs().sum() == 0  # truncated: no gradient from that token
    uncapped = clipped_surrogate_loss(logp, behaviour, torch.tensor([-1.0]), torch.ones(1, 1), 0.2)
    assert uncapped.item() > 50


def test_kl_penalty_is_zero_at_the_reference_and_positive_away_from_it():
    ref = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    assert kl_penalty(ref, ref, mask).item() == pytest.approx(0.0)
    assert kl_penalty(torch.tensor([[-0.5, -3.0]]), ref, mask).item() > 0.05


def test_the_entropy_surrogate_s_expected_gradient_is_the_negative_entropy_s():
    """Averaged over tokens sampled from pi (here: every token, weighted by its
    probability), the sampled-token surrogate's gradient equals the exact
    gradient of -H(pi); so minimising it raises the entropy."""
    torch.manual_seed(0)
    logits = torch.randn(7, requires_grad=True)
    logp = torch.log_softmax(logits, dim=0)
    exact = torch.autograd.grad((logp.exp() * logp).sum(), logits)[0]  # grad of -H
    expected = torch.zeros(7)
    for token in range(7):
        logp = torch.log_softmax(logits, dim=0)
        surrogate = entropy_surrogate(logp[token].reshape(1, 1), torch.ones(1, 1))
        expected += logp[token].exp().detach() * torch.autograd.grad(surrogate, logits)[0]
    assert torch.allclose(expected, exact, atol=1e-6)
    # Descending it flattens the distribution.
    before = -(logp.exp() * logp).sum()
    after_logp = torch.log_softmax(logits - 0.5 * exact, dim=0)
    assert -(after_logp.exp() * after_logp).sum() > before


@pytest.mark.parametrize(("loss_type", "expected"), [("dapo", 6 / 5), ("grpo", (1 + 2) / 2), ("dr_grpo", 6 / (2 * 8))])
def test_each_loss_type_weighs_tokens_as_its_name_says(loss_type, expected):
    """A 4-token answer of loss 1 a token and a 1-token answer of loss 2: dapo
    averages the 5 tokens, grpo the 2 answers' means, dr_grpo divides the sum
    by 2 answers x 8 tokens (the answer budget)."""
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    denominator = loss_denominator(loss_type, rows=2, tokens=5, max_completion_length=8)
    assert loss_numerator(per_token, mask, loss_type) / denominator == pytest.approx(expected)
