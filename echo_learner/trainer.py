"""The policy model, its optimiser, and one GRPO step.

Runs in a worker thread (``trio.to_thread.run_sync``) so the trio loop that
serves nodes stays responsive while torch computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from safetensors.torch import save

from echo_learner.grpo import clipped_surrogate_loss, group_advantages


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
    reward_mean: float
    tokens: int


class Trainer:
    def __init__(self, model: torch.nn.Module, *, lr: float, clip_eps: float, pad_id: int):
        self.model = model
        self.clip_eps = clip_eps
        self.pad_id = pad_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def weights(self) -> bytes:
        """The current weights as safetensors bytes (what gets chunked and published)."""
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        # Tied embeddings share storage and safetensors refuses shared tensors;
        # the receiver re-ties lm_head to the embedding.
        state = {
            k: v.detach().contiguous()
            for k, v in self.model.state_dict().items()
            if not (tied and k == "lm_head.weight")
        }
        return save(state)

    def step(self, groups: list[ScoredGroup]) -> StepStats:
        """One optimiser step on a batch of scored groups."""
        sizes = {len(g.rewards) for g in groups}
        if len(sizes) != 1:
            raise ValueError(f"groups of different sizes in one step: {sorted(sizes)}")
        rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        advantages = group_advantages(rewards).flatten()

        seqs, starts, behaviour = [], [], []
        for g in groups:
            for tokens, logprobs in zip(g.completions, g.behaviour_logprobs):
                seqs.append(list(g.prompt_tokens) + list(tokens))
                starts.append(len(g.prompt_tokens))
                behaviour.append(list(logprobs))
        width = max(len(s) for s in seqs)
        n = len(seqs)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        # Position t predicts token t+1, so completion token j of a sequence
        # whose prompt has length p is scored at position p - 1 + j.
        mask = torch.zeros((n, width - 1))
        old = torch.zeros((n, width - 1))
        for i, (s, p, b) in enumerate(zip(seqs, starts, behaviour)):
            input_ids[i, : len(s)] = torch.tensor(s)
            attention[i, : len(s)] = 1
            mask[i, p - 1 : p - 1 + len(b)] = 1
            old[i, p - 1 : p - 1 + len(b)] = torch.tensor(b)

        self.model.train()
        logits = self.model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        taken = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        loss = clipped_surrogate_loss(taken, old, advantages, mask, self.clip_eps)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return StepStats(
            loss=float(loss.detach()),
            reward_mean=float(rewards.mean()),
            tokens=int(mask.sum()),
        )
