"""The policy model, its optimiser, and one GRPO step.

Runs in a worker thread (``trio.to_thread.run_sync``) so the trio loop that
serves nodes stays responsive while torch computes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from echo_learner.training.device import of as device_of
from echo_learner.training.grpo import (
    IMPORTANCE_LEVELS,
    LOSS_TYPES,
    SCALE_REWARDS,
    clipped_surrogate,
    entropy_surrogate,
    group_advantages,
    kl_per_token,
    log_importance_weights,
    loss_denominator,
    loss_numerator,
    token_sum,
)
from echo_learner.training.logprobs import TRAIN_BYTES_PER_LOGIT, right_padded, row_slices, whole_row_logprobs
from echo_learner.training.lora import frozen_copy, state_bytes
from echo_learner.training.packing import packed_logprobs, parts


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
    """The loss, in the terms of ``echo_learner.training.grpo`` (TRL's names in brackets)."""

    clip_eps: float  # [epsilon]
    ratio_cap: float  # [delta]
    kl_coef: float  # [beta]
    kl_importance_weighted: bool = True  # [use_bias_correction_kl]
    entropy_coef: float = 0.0  # ours: entropy_surrogate
    push_down_flat: bool = False  # ours: see group_advantages
    loss_type: str = "dapo"  # [loss_type]
    clip_eps_high: float | None = None  # [epsilon_high]; None: clip_eps
    scale_rewards: str = "group"  # [scale_rewards]
    importance_level: str = "token"  # [importance_sampling_level]
    max_completion_length: int = 0  # dr_grpo's divisor [max_completion_length]

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("loss_type", self.loss_type, LOSS_TYPES),
            ("scale_rewards", self.scale_rewards, SCALE_REWARDS),
            ("importance_level", self.importance_level, IMPORTANCE_LEVELS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, not {value!r}")
        if self.loss_type == "dr_grpo" and self.max_completion_length < 1:
            raise ValueError("dr_grpo divides by max_completion_length: give it")


PRECISIONS = ("f32", "bf16")


@dataclass(frozen=True)
class Passes:
    """How a step goes through the model."""

    max_logit_bytes: int = 2**30  # logits one pass may hold: a bigger batch goes in parts
    # Groups packed, each prompt once (few passes, fewer tokens), or whole
    # rows in parts (a fixed number of passes: FSDP ranks need that).
    pack: bool = True
    # "bf16": the passes under bf16 autocast, weights and optimiser in f32
    # (what TRL does on a GPU); the loss is computed in f32 either way.
    precision: str = "f32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {self.precision!r}")


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
        temperature: float = 1.0,
        reference: torch.nn.Module | None = None,
        passes: Passes = Passes(),
    ):
        self.model = model
        self._passes = passes
        self.temperature = temperature
        self.objective = objective
        self.pad_id = pad_id
        # Only what trains (a LoRA model's adapters; every weight otherwise).
        trainable = list(trainable_of(model))
        # torch's fused kernel: 0.09 s a step for SmolLM2's weights on one
        # core against 0.48 s. FSDP's sharded parameters take the default.
        fused = all(p.device.type in ("cpu", "cuda") and not isinstance(p, DTensor) for p in trainable)
        self.optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0, fused=fused or None)
        # The reference policy for the KL penalty is the starting model, frozen
        # (given when the model cannot be copied: FSDP's shards).
        if reference is None and objective.kl_coef > 0:
            reference = copy.deepcopy(model).eval()
        self.reference = reference if objective.kl_coef > 0 else None

    def weights(self) -> bytes:
        """The current weights of a plain (not LoRA) model as safetensors bytes."""
        return state_bytes(self.model)

    def snapshot(self) -> torch.nn.Module:
        """A frozen copy of the current policy as published (to verify rollouts made with it)."""
        return frozen_copy(self.model)

    def step(self, groups: list[ScoredGroup]) -> StepStats:
        """One optimiser step on a batch of scored groups."""
        batch = Batch.of(groups, self.objective)
        if batch is None:
            # Every group scored all its completions alike: nothing to learn.
            # An AdamW step on zero gradients would still move the weights and
            # decay its second moments, so that the next small gradient makes
            # an outsized update (measured: a solved task drifting back from
            # reward 1.0 to 0.65). Skip it.
            return StepStats(loss=0.0, kl=0.0, reward_mean=reward_mean(groups), tokens=0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss, kl = self.backward(batch, range(len(batch.completions)))
        torch.nn.utils.clip_grad_norm_(trainable_of(self.model), 1.0)
        self.optimizer.step()
        return StepStats(loss=loss, kl=kl, reward_mean=batch.reward_mean, tokens=batch.tokens)

    def backward(self, batch: Batch, rows: range, *, passes: int = 0, scale: float = 1.0) -> tuple[float, float]:
        """Accumulate the gradient of ``rows``' share of the batch's loss;
        their ``(loss, kl)`` contributions.

        The groups go through the model packed, each prompt once
        (``packing.packed_logprobs``), in parts whose logits fit the memory
        budget; each part's loss divided by the whole batch's
        denominator (``grpo.loss_denominator``), so that parts (and the ranks
        of ``--train-procs``, each given some rows) add up to the whole
        batch's loss. ``passes``: run at least this many forward/backward
        passes, padding with passes that add nothing (sharded ranks must all
        run the same number).
        ``scale`` multiplies the gradient (FSDP averages over ranks).
        """
        obj = self.objective
        where = device_of(self.model)
        prompts = [batch.prompts[i] for i in rows]
        completions = [batch.completions[i] for i in rows]
        behaviour = [batch.behaviour[i] for i in rows]
        advantages = batch.advantages[rows.start : rows.stop : rows.step].to(where)
        pieces = self._parts(prompts, completions)
        total_loss, total_kl = 0.0, 0.0
        denominator = loss_denominator(
            obj.loss_type, rows=batch.rows, tokens=batch.tokens, max_completion_length=obj.max_completion_length
        )
        for part in pieces:
            logprobs, mask = self._logprobs(self.model, prompts, completions, part)
            old = right_padded(behaviour[part], logprobs.shape[1], where)
            weights = log_importance_weights(logprobs, old, mask, obj.importance_level)
            per_token = clipped_surrogate(weights, advantages[part], obj.clip_eps, obj.ratio_cap, obj.clip_eps_high)
            kl = torch.zeros(())
            if self.reference is not None:
                with torch.no_grad():
                    ref, _ = self._logprobs(self.reference, prompts, completions, part)
                per_token_kl = kl_per_token(logprobs, ref)
                kl = token_sum(per_token_kl, mask) / batch.tokens
                if obj.kl_importance_weighted:
                    # The samples came from the node's policy: weighting by the
                    # ratio makes the gradient the unbiased reverse KL's.
                    per_token_kl = per_token_kl * torch.exp(weights)
                per_token = per_token + obj.kl_coef * per_token_kl
            loss = loss_numerator(per_token, mask, obj.loss_type) / denominator
            if obj.entropy_coef:
                loss = loss + obj.entropy_coef * entropy_surrogate(logprobs, mask) * float(mask.sum()) / batch.tokens
            (loss * scale).backward()
            total_loss += float(loss.detach())
            total_kl += float(kl.detach())
        for _ in range(passes - len(pieces)):
            self._empty_pass()
        return total_loss, total_kl

    def _empty_pass(self) -> None:
        """A forward and backward pass that adds nothing to the gradient."""
        ids = torch.tensor([[self.pad_id]], device=device_of(self.model))
        (self.model(input_ids=ids).logits.sum() * 0.0).backward()

    def passes(self, batch: Batch, rows: range) -> int:
        """How many forward/backward passes ``backward`` makes for ``rows``."""
        return len(self._parts([batch.prompts[i] for i in rows], [batch.completions[i] for i in rows]))

    def _parts(self, prompts: list[tuple[int, ...]], completions: list[tuple[int, ...]]) -> list[slice]:
        vocab = self.model.config.vocab_size
        if self._passes.pack:
            return parts(prompts, completions, vocab, self._passes.max_logit_bytes)
        widths = [len(p) + len(c) for p, c in zip(prompts, completions)]
        return row_slices(widths, vocab, self._passes.max_logit_bytes, TRAIN_BYTES_PER_LOGIT)

    def _logprobs(
        self, model: torch.nn.Module, prompts: list, completions: list, part: slice
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_of(model).type, dtype=torch.bfloat16, enabled=self._passes.precision == "bf16"):
            if self._passes.pack:
                return packed_logprobs(model, prompts[part], completions[part], self.pad_id, self.temperature)
            return whole_row_logprobs(model, prompts[part], completions[part], self.pad_id, self.temperature)

    # What the learner does around steps; the same for --train-procs workers
    # (echo_learner.training.train_group.TrainGroup).

    def sync(self) -> None:
        """Make ``model`` hold the newest weights (here it always does)."""

    def optimizer_state(self) -> dict:
        """The optimiser's state as ``torch.optim.Optimizer.state_dict`` gives it (checkpoints)."""
        return self.optimizer.state_dict()

    def resume(self, optimizer_state: dict) -> None:
        """Continue from a checkpoint whose weights ``model`` was given in place."""
        self.optimizer.load_state_dict(optimizer_state)

    def close(self) -> None:
        """Nothing to stop: training runs in this process."""


def reward_mean(groups: list[ScoredGroup]) -> float:
    return float(torch.tensor([g.rewards for g in groups], dtype=torch.float32).mean())


@dataclass(frozen=True)
class Batch:
    """A step's groups flattened to rows (one completion each), with their advantages."""

    prompts: list[tuple[int, ...]]
    completions: list[tuple[int, ...]]
    behaviour: list[tuple[float, ...]]
    advantages: torch.Tensor  # [rows]
    tokens: int
    reward_mean: float

    @property
    def rows(self) -> int:
        return len(self.completions)

    @classmethod
    def of(cls, groups: list[ScoredGroup], objective: Objective) -> Batch | None:
        """The batch, or None when no group has any signal (every advantage 0)."""
        sizes = {len(g.rewards) for g in groups}
        if len(sizes) != 1:
            raise ValueError(f"groups of different sizes in one step: {sorted(sizes)}")
        rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        advantages = group_advantages(
            rewards, scale=objective.scale_rewards, push_down_flat=objective.push_down_flat
        ).flatten()
        if not advantages.any():
            return None
        completions = [c for g in groups for c in g.completions]
        return cls(
            prompts=[g.prompt_tokens for g in groups for _ in g.completions],
            completions=completions,
            behaviour=[b for g in groups for b in g.behaviour_logprobs],
            advantages=advantages,
            tokens=sum(len(c) for c in completions),
            reward_mean=float(rewards.mean()),
        )
