"""Log-probs of completion tokens under a model: used to train and to verify.

The trainer needs them with gradients; verification recomputes a node's
reported log-probs without. Both must pack sequences the same way, so they
share this one function.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def completion_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, mask)``, both ``[n, width - 1]``.

    Row ``i`` is ``prompts[i] + completions[i]``, right-padded. Position t
    predicts token t + 1, so completion token j of a row whose prompt has
    length p sits at position p - 1 + j; ``mask`` marks those positions.
    Log-probs are the log-softmax of the raw logits (temperature 1).
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
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    taken = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return taken, mask


def spread(values: Sequence[Sequence[float]], prompts: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """Per-completion-token values laid out like ``completion_logprobs``'s output."""
    out = torch.zeros((len(values), width))
    for i, (v, p) in enumerate(zip(values, prompts)):
        out[i, len(p) - 1 : len(p) - 1 + len(v)] = torch.tensor(v, dtype=torch.float32)
    return out
