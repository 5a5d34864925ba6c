"""The policy model, its optimiser, and one GRPO step.

Runs in a worker thread (``trio.to_thread.run_sync``) so the trio loop that
serves nodes stays responsive while torch computes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from echo_learner.device import of as device_of
from echo_learner.grpo import clipped_surrogate_loss, group_advantages, kl_penalty
from echo_learner.lora import state_bytes
from echo_learner.logprobs import TRAIN_BYTES_PER_LOGIT, completion_logprobs, row_slices, spread


@dataclass(frozen=True)
class ScoredGroup:
    """One prompt's completions, scored by the learner."""

    prompt_tokens: tuple[int, ...]
    completions: tuple[tuple[int, ...], ...]
    behaviour_logprobs: tuple[tuple[float, ...], ...]
    rewards: tuple[float, ...]


@dataclass(frozen=True)
class StepStats:
    loss: float
    kl: float
    reward_mean: float
    tokens: int


@dataclass(frozen=True)
class Objective:
    clip_eps: float
    ratio_cap: float
    kl_coef: float


def trainable_of(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float,
        objective: Objective,
        pad_id: int,
        max_logit_bytes: int = 2**30,
        temperature: float = 1.0,
    ):
        self.model = model
        self.temperature = temperature
        self.objective = objective
        self.pad_id = pad_id
        self.max_logit_bytes = max_logit_bytes
        # Only what trains (a LoRA model's adapters; every weight otherwise).
        self.optimizer = torch.optim.AdamW(trainable_of(model), lr=lr, weight_decay=0.0)
        # The reference policy for the KL penalty is the starting model, frozen.
        self.reference = copy.deepcopy(model).eval() if objective.kl_coef > 0 else None

    def weights(self) -> bytes:
        """The current weights of a plain (not LoRA) model as safetensors bytes."""
        return state_bytes(self.model)

    def snapshot(self) -> torch.nn.Module:
        """A frozen copy of the current policy (to verify rollouts made with it)."""
        return copy.deepcopy(self.model).eval().requires_grad_(False)

    def step(self, groups: list[ScoredGroup]) -> StepStats:
        """One optimiser step on a batch of scored groups."""
        sizes = {len(g.rewards) for g in groups}
        if len(sizes) != 1:
            raise ValueError(f"groups of different sizes in one step: {sorted(sizes)}")
        where = device_of(self.model)
        rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        advantages = group_advantages(rewards).flatten().to(where)
        if not advantages.any():
            # Every group scored all its completions alike: nothing to learn.
            # An AdamW step on zero gradients would still move the weights and
            # decay its second moments, so that the next small gradient makes
            # an outsized update (measured: a solved task drifting back from
            # reward 1.0 to 0.65). Skip it.
            return StepStats(loss=0.0, kl=0.0, reward_mean=float(rewards.mean()), tokens=0)
        prompts = [g.prompt_tokens for g in groups for _ in g.completions]
        completions = [c for g in groups for c in g.completions]
        behaviour = [b for g in groups for b in g.behaviour_logprobs]
        tokens = sum(len(c) for c in completions)

        # Long answers: the batch goes through the model in parts whose
        # logits fit the memory budget, each part's loss weighted by its
        # share of the tokens, so the gradient is the whole batch's mean.
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        obj = self.objective
        total_loss, total_kl = 0.0, 0.0
        widths = [len(p) + len(c) for p, c in zip(prompts, completions)]
        vocab = self.model.config.vocab_size
        for part in row_slices(widths, vocab, self.max_logit_bytes, TRAIN_BYTES_PER_LOGIT):
            logprobs, mask = completion_logprobs(
                self.model, prompts[part], completions[part], self.pad_id, self.temperature
            )
            share = float(mask.sum()) / tokens
            old = spread(behaviour[part], prompts[part], logprobs.shape[1], where)
            loss = clipped_surrogate_loss(logprobs, old, advantages[part], mask, obj.clip_eps, obj.ratio_cap)
            kl = torch.zeros(())
            if self.reference is not None:
                with torch.no_grad():
                    ref, _ = completion_logprobs(
                        self.reference, prompts[part], completions[part], self.pad_id, self.temperature
                    )
                kl = kl_penalty(logprobs, ref, mask)
                loss = loss + obj.kl_coef * kl
            (loss * share).backward()
            total_loss += float(loss.detach()) * share
            total_kl += float(kl.detach()) * share
        torch.nn.utils.clip_grad_norm_(trainable_of(self.model), 1.0)
        self.optimizer.step()
        return StepStats(loss=total_loss, kl=total_kl, reward_mean=float(rewards.mean()), tokens=tokens)
