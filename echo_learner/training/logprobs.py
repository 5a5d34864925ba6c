"""Log-probs of completion tokens under a model: used to train and to verify.

The trainer needs them with gradients, its groups packed each prompt once
(``echo_learner.training.packing``); verification recomputes a node's
reported log-probs sharing each prompt's KV cache (``grouped_token_stats``), and
``completion_logprobs``, the plain recompute of whole rows, is what both are
tested against. All
are the log-softmax of the logits over the job's sampling temperature (the
distribution nodes sample from); tests hold them equal.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from echo_learner.training.device import of as device_of

# What one logit costs in memory at its peak, in float32 copies of the
# logits: verification holds the logits, the log-softmax of the rows it
# measures and four intermediates of their statistics; training the logits,
# their log-softmax and the gradient of each.
VERIFY_BYTES_PER_LOGIT = 6 * 4
# The tail of a distribution, for the truncation test (echo_learner.verify.evidence):
# the tokens outside the fewest most likely ones that hold TAIL_TOP_P of the
# mass, and never more than TAIL_TOP_K of them. That is what llama.cpp's
# default chat samplers (top-k 40, top-p 0.95) never draw; any stronger
# truncation (min-p, smaller k or p, greedy) never draws them either.
TAIL_TOP_K = 40
TAIL_TOP_P = 0.95
# The alternatives to exact sampling each sampled token is weighed against
# (log-likelihood ratios; echo_learner.verify.evidence sums them per peer): the
# policy p tilted to p^(1 - d), i.e. sampled at a temperature T / (1 - d)
# (1.11 T and 0.87 T); tokens weighted by exp(-c (surprise - entropy)^2),
# i.e. drawn where their surprise is about the entropy; and a tail drawn
# from half as often as its mass says.
HOTTER = 0.1
COLDER = -0.15
CONCENTRATION = 0.1
TAIL_DEFICIT = 0.5
ALTERNATIVES = ("hotter", "colder", "concentrated", "tail")
TRAIN_BYTES_PER_LOGIT = 4 * 4
# Verification's batches of completions: at most this many padded tokens per real one.
PADDING_SLACK = 1.25


def row_slices(widths: Sequence[int], vocab: int, max_bytes: int, bytes_per_logit: int) -> list[slice]:
    """Consecutive slices of rows whose padded logits (rows x widest x vocab)
    fit ``max_bytes``: long answers are split over several forward passes
    instead of one that runs the machine out of memory. A row too wide on
    its own still gets a slice of its own."""
    slices: list[slice] = []
    start, widest = 0, 0
    for i, width in enumerate(widths):
        wider = max(widest, width)
        if i > start and (i - start + 1) * wider * vocab * bytes_per_logit > max_bytes:
            slices.append(slice(start, i))
            start, wider = i, width
        widest = wider
    if widths:
        slices.append(slice(start, len(widths)))
    return slices


def completion_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, mask)``, both ``[n, width - 1]``.

    Row ``i`` is ``prompts[i] + completions[i]``, right-padded. Position t
    predicts token t + 1, so completion token j of a row whose prompt has
    length p sits at position p - 1 + j; ``mask`` marks those positions.
    Log-probs are the log-softmax of the logits divided by ``temperature``
    (the distribution nodes sample from).
    """
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs)
    n = len(seqs)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1))
    for i, (s, p, c) in enumerate(zip(seqs, prompts, completions)):
        input_ids[i, : len(s)] = torch.tensor(s)
        attention[i, : len(s)] = 1
        mask[i, len(p) - 1 : len(p) - 1 + len(c)] = 1
    where = device_of(model)
    input_ids, attention, mask = input_ids.to(where), attention.to(where), mask.to(where)
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    taken = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return taken, mask


def length_buckets(lengths: Sequence[int], slack: float = PADDING_SLACK) -> list[list[int]]:
    """Rows (indices) in batches of similar length, longest first: a batch
    is padded to its longest row, and ``slack`` bounds its padded tokens
    over its real ones."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    real = 0
    for i in order:
        if buckets and (len(buckets[-1]) + 1) * lengths[buckets[-1][0]] <= slack * (real + lengths[i]):
            buckets[-1].append(i)
            real += lengths[i]
        else:
            buckets.append([i])
            real = lengths[i]
    return buckets


def whole_row_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``completion_logprobs`` in ``packing.packed_logprobs``' layout, from one
    forward pass whatever the rows: what sharded (FSDP) ranks need, whose
    every pass is a collective that all ranks must make alike."""
    full, _ = completion_logprobs(model, prompts, completions, pad_id, temperature)
    rows = [full[i, len(p) - 1 : len(p) - 1 + len(c)] for i, (p, c) in enumerate(zip(prompts, completions))]
    mask = completion_mask([len(c) for c in completions], full.device)
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), mask


def completion_mask(lengths: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """1 where a right-padded row of completion tokens has a real token."""
    return (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).float().to(device)


def right_padded(values: Sequence[Sequence[float]], width: int, device: torch.device | None = None) -> torch.Tensor:
    """Per-completion-token values laid out like ``packing.packed_logprobs``' output."""
    out = torch.zeros((len(values), width))
    for i, v in enumerate(values):
        out[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
    return out.to(device) if device is not None else out


@dataclass(frozen=True)
class TokenStats:
    """Per sampled token of one completion, under the learner's model: the
    token's log-prob, the entropy and variance of ``-log p`` of the whole
    distribution it was sampled from (what an honest sample's surprise
    averages to, and how much it spreads), the probability mass of that
    distribution's tail (``TAIL_TOP_K``, ``TAIL_TOP_P``) and whether the token
    came from it (an honest sampler draws from the tail exactly that often),
    and how much likelier the token is under each way of sampling otherwise
    than asked (``HOTTER`` ... ``TAIL_DEFICIT``) than under the policy."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    variance: torch.Tensor
    tail_mass: torch.Tensor
    in_tail: torch.Tensor
    # Log-likelihood ratios of the token under each alternative (HOTTER, ...).
    hotter: torch.Tensor
    colder: torch.Tensor
    concentrated: torch.Tensor
    tail: torch.Tensor


def _spread_stats(lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy and variance of ``-log p`` for log-prob rows ``lp`` [..., vocab]."""
    p = lp.exp()
    plogp = torch.xlogy(p, p)  # 0 where p underflows to 0
    entropy = -plogp.sum(-1)
    second = torch.nan_to_num(plogp * lp, nan=0.0).sum(-1)
    return entropy, (second - entropy * entropy).clamp(min=0.0)


@dataclass(frozen=True)
class _Rows:
    """What a log-prob row (one next-token distribution) gives every token
    drawn from it: its entropy and the variance of the surprise, its tail's
    mass and the log-prob where the tail starts, and the log normalisers of
    the alternatives."""

    entropy: torch.Tensor
    variance: torch.Tensor
    tail_mass: torch.Tensor
    tail_edge: torch.Tensor
    hotter: torch.Tensor
    colder: torch.Tensor
    concentrated: torch.Tensor

    @classmethod
    def of(cls, lp: torch.Tensor) -> _Rows:
        entropy, variance = _spread_stats(lp)
        top = lp.topk(min(TAIL_TOP_K, lp.shape[-1]), dim=-1).values  # most likely first
        cumulative = top.exp().cumsum(-1)
        inside = ((cumulative < TAIL_TOP_P).sum(-1, keepdim=True) + 1).clamp(max=top.shape[-1])
        off = (-lp - entropy.unsqueeze(-1)).square_().mul_(-CONCENTRATION).add_(lp)
        concentrated = torch.logsumexp(off, dim=-1)
        del off
        return cls(
            entropy=entropy,
            variance=variance,
            tail_mass=(1.0 - cumulative.gather(-1, inside - 1)).clamp(min=0.0).squeeze(-1),
            tail_edge=top.gather(-1, inside - 1).squeeze(-1),  # the least likely token inside
            hotter=torch.logsumexp((1 - HOTTER) * lp, dim=-1),
            colder=torch.logsumexp((1 - COLDER) * lp, dim=-1),
            concentrated=concentrated,
        )

    def select(self, index: torch.Tensor) -> _Rows:
        return _Rows(*(getattr(self, f)[index] for f in self.__dataclass_fields__))

    def tokens(self, drawn: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``TokenStats``' fields for tokens of log-prob ``drawn``, one per row."""
        in_tail = (drawn < self.tail_edge).float()
        kept = 1 - (1 - TAIL_DEFICIT) * self.tail_mass
        tail = torch.where(in_tail > 0, math.log(1 - TAIL_DEFICIT), torch.log(kept / (1 - self.tail_mass)))
        surprise = -drawn - self.entropy
        return (
            drawn,
            self.entropy,
            self.variance,
            self.tail_mass,
            in_tail,
            -HOTTER * drawn - self.hotter,
            -COLDER * drawn - self.colder,
            -CONCENTRATION * surprise.square() - self.concentrated,
            tail,
        )


@torch.no_grad()
def grouped_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    groups: Sequence[Sequence[Sequence[int]]],
    pad_id: int,
    max_bytes: int = 2**30,
    temperature: float = 1.0,
) -> list[list[torch.Tensor]]:
    """Log-probs of every completion's tokens; ``groups[g]`` all continue ``prompts[g]``."""
    found = _grouped(model, prompts, groups, pad_id, max_bytes, temperature, lambda lp, drawn, rows: (drawn,))
    return [[fields[0] for fields in g] for g in found]


@torch.no_grad()
def grouped_token_stats(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    groups: Sequence[Sequence[Sequence[int]]],
    pad_id: int,
    max_bytes: int = 2**30,
    temperature: float = 1.0,
) -> list[list[TokenStats]]:
    """``TokenStats`` of every completion; ``groups[g]`` all continue ``prompts[g]``."""

    def measure(lp: torch.Tensor, drawn: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        stats = _Rows.of(lp)
        return (stats if rows is None else stats.select(rows)).tokens(drawn)

    found = _grouped(model, prompts, groups, pad_id, max_bytes, temperature, measure)
    return [[TokenStats(*fields) for fields in g] for g in found]


# (log-prob rows, the log-prob of each token drawn, the row each was drawn
# from (None: one token per row)) -> per-token fields.
Measure = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, ...]]


def _prompt_pass(model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, torch.Tensor]:
    """The model's pass over ``prompts``, left-padded, keeping their KV cache
    and only their last position's logits; and the mask of real positions."""
    n_groups, width_p = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((n_groups, width_p), pad_id, dtype=torch.long)
    seen = torch.zeros((n_groups, width_p), dtype=torch.long)
    for g, p in enumerate(prompts):
        ids[g, width_p - len(p) :] = torch.tensor(list(p))
        seen[g, width_p - len(p) :] = 1
    where = device_of(model)
    ids, seen = ids.to(where), seen.to(where)
    positions = (seen.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=seen, position_ids=positions, use_cache=True, logits_to_keep=1)
    return out, seen


def _grouped(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    groups: Sequence[Sequence[Sequence[int]]],
    pad_id: int,
    max_bytes: int,
    temperature: float,
    measure: Measure,
) -> list[list[tuple[torch.Tensor, ...]]]:
    """``measure`` (``Measure``) of every token of every completion;
    ``groups[g]`` all continue ``prompts[g]``.

    Verification's shape: a GRPO group is many completions of one prompt, so
    each prompt goes through the model once and its KV cache is shared by its
    completions (the full recompute of ``completion_logprobs`` repeats the
    prompt for every completion: on SmolLM2 with 5-token prompts and 4-token
    completions, twice the work). First the prompts, left-padded, keeping only
    their last position's logits; then the completions, right-padded, in
    batches of similar length (``length_buckets``) each cut where its logits
    would exceed ``max_bytes``. Only positions that predict a real token are
    measured, not the padding.
    """
    out, seen = _prompt_pass(model, prompts, pad_id)
    where = seen.device
    first = torch.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)  # predicts each completion's token 0

    sizes = [len(group) for group in groups]
    rows = [(g, c) for g, group in enumerate(groups) for c in group]
    owners = torch.tensor([g for g, _ in rows], device=first.device)
    firsts = torch.tensor([c[0] for _, c in rows], device=first.device)
    heads = measure(first, first[owners, firsts], owners)  # a group's first tokens share their row
    result = [tuple(field[i : i + 1] for field in heads) for i in range(len(rows))]
    vocab = first.shape[-1]

    def measure_part(part: Sequence[int]) -> None:
        """One pass over the completions ``rows[i]`` for i in ``part``: extends
        their ``result[i]`` (their first token's fields) by the rest."""
        chunk = [rows[i] for i in part]
        width = max(len(c) for _, c in chunk)
        if width < 2:
            return  # one-token completions: the prompt pass scored them
        tokens = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        present = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (_, c) in enumerate(chunk):
            tokens[i, : len(c)] = torch.tensor(list(c))
            present[i, : len(c)] = 1
        tokens, present = tokens.to(where), present.to(where)
        owner = torch.tensor([g for g, _ in chunk], device=where)
        cache = copy.deepcopy(out.past_key_values)
        cache.batch_select_indices(owner)  # every row gets its own prompt's cache
        # Position j of a completion predicts its token j + 1; right padding
        # comes after every real token, so causal attention never sees it.
        attention = torch.cat([seen[owner], present[:, :-1]], dim=1)
        steps = torch.arange(width - 1)[None, :] + torch.tensor([len(prompts[g]) for g, _ in chunk])[:, None]
        logits = model(
            input_ids=tokens[:, :-1], attention_mask=attention, position_ids=steps.to(where), cache=cache
        ).logits
        real = present[:, 1:].bool()  # positions that predict a token of the completion
        lp = torch.log_softmax(logits[real].float() / temperature, dim=-1)  # [tokens, vocab]
        del logits
        rest = measure(lp, lp.gather(-1, tokens[:, 1:][real].unsqueeze(-1)).squeeze(-1), None)
        del lp
        start = 0
        for i, (_, c) in zip(part, chunk):
            result[i] = tuple(
                torch.cat([head, tail[start : start + len(c) - 1]]) for head, tail in zip(result[i], rest)
            )
            start += len(c) - 1

    for bucket in length_buckets([len(c) for _, c in rows]):
        widths = [len(rows[i][1]) - 1 for i in bucket]
        for part in row_slices(widths, vocab, max_bytes, VERIFY_BYTES_PER_LOGIT):
            measure_part(bucket[part])
    flat = [tuple(t.cpu() for t in r) for r in result]
    out_groups, i = [], 0
    for size in sizes:
        out_groups.append(flat[i : i + size])
        i += size
    return out_groups
