"""GRPO's pieces as small pure functions: advantages, the clipped loss, the KL penalty, the entropy bonus."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, *, push_down_flat: bool = False) -> torch.Tensor:
    """Group-normalised advantages.

    ``rewards`` is ``[groups, group_size]``; each reward is compared with the
    mean of its own group (the same prompt) and scaled by the group's std. A
    group whose completions all scored the same teaches nothing: zeros.

    Unless ``push_down_flat``: then such a flat group that scored below the
    step's mean reward gets its rewards' standard scores among all the
    step's rewards (negative). Without it, a prompt on which the policy has
    turned certain of a wrong answer (its 16 samples alike) is never learned
    again: on the reverse task, on-policy runs stalled at reward 0.8 with
    40-50 % of groups flat below the best reward. Pushing such answers down
    is negative-sample reinforcement (Zhu et al., 2025), which keeps the
    policy exploring. Flat groups at or above the mean stay at zero:
    sharpening what is already certain teaches nothing.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    advantages = (rewards - mean) / (std + eps)
    if not push_down_flat:
        return advantages
    against_step = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)
    return torch.where(std < eps, against_step.clamp(max=0.0), advantages)


def clipped_surrogate_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ratio_cap: float = float("inf"),
) -> torch.Tensor:
    """PPO-style clipped objective over tokens with truncated importance weights.

    ``logprobs`` are the learner's (with grad), ``behaviour_logprobs`` what the
    node reported when it sampled (the behaviour policy mu, possibly stale or
    quantized), both ``[seqs, T]``; ``advantages`` is ``[seqs]``; ``mask``
    marks real completion tokens. The token's weight is pi_theta / mu.

    PPO's clip bounds the ratio only where that helps the objective; with a
    negative advantage the unclipped branch grows without bound as the ratio
    does, and stale or quantized behaviour log-probs make large ratios common.
    ``ratio_cap`` truncates it there (dual-clip PPO), so one token the node
    found unlikely cannot dominate a step. The loss is averaged over tokens.
    """
    ratio = torch.exp(logprobs - behaviour_logprobs)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    surrogate = torch.minimum(unclipped, clipped)
    surrogate = torch.where(adv < 0, torch.maximum(surrogate, ratio_cap * adv), surrogate)
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean per-token KL(pi_theta || pi_ref), the k3 estimator (always >= 0, unbiased)."""
    delta = ref_logprobs - logprobs
    per_token = torch.exp(delta) - delta - 1
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def entropy_surrogate(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient is that of the policy's negative entropy, from the
    sampled tokens alone: E_a[log pi(a) * grad log pi(a)] = grad sum_a pi(a) log pi(a)
    (the full distributions are never materialised). Its value is not the
    entropy; ``-logprobs`` averaged over tokens estimates that.

    Minimising it with a small weight keeps the policy from turning
    deterministic on prompts it has not solved: measured on the reverse task
    (one process, 500 GRPO steps of 16 x 16), on-policy training plateaued at
    reward 0.70 on two seeds without it and at 0.88-0.90 with weight 0.1.
    """
    return (logprobs.detach() * logprobs * mask).sum() / mask.sum().clamp(min=1)
