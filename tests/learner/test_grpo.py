import torch

from echo_learner.grpo import clipped_surrogate_loss, group_advantages


def test_advantages_are_group_normalised():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv = group_advantages(rewards)
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-4)
    assert torch.equal(adv[1], torch.zeros(4))  # a uniform group teaches nothing


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
