"""GRPO's pieces as small pure functions: advantages, importance ratios, the loss."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages.

    ``rewards`` is ``[groups, group_size]``; each reward is compared with the
    mean of its own group (the same prompt) and scaled by the group's std. A
    group whose completions all scored the same teaches nothing: zeros.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)


def clipped_surrogate_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
) -> torch.Tensor:
    """PPO-style clipped objective over tokens, negated for minimisation.

    ``logprobs`` are the learner's (with grad), ``behaviour_logprobs`` what the
    node reported when it sampled (the behaviour policy), both ``[seqs, T]``;
    ``advantages`` is ``[seqs]``; ``mask`` marks real completion tokens. The
    loss is averaged over real tokens.
    """
    ratio = torch.exp(logprobs - behaviour_logprobs)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)
