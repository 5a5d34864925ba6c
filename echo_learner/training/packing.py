"""A training pass over many GRPO groups at once: each group's prompt and
completions packed into one row, a mask that keeps every completion to its
prompt and itself.

A group is one prompt and many completions of it. Run as whole rows, the
prompt goes through the model once per completion; run as a prompt pass
whose KV cache the completions share, it takes one forward pass for the
prompt and one per batch of similar-length completions, each with a backward
of its own through the whole model: on SmolLM2 with 4 groups of 8, 13
embedding gradients of 113 MB each, weight gradients from passes of 4 to 30
tokens, and on a GPU a pass's fixed cost paid dozens of times a step.

Packed, a group is one row: the prompt, then each completion but its last
token (nothing is predicted from it), each at the positions it has in its own
sequence. The attention mask lets a prompt token see the prompt before it and
a completion token see the whole prompt and its own completion before it,
never another completion: exactly what each sees in its own sequence, so the
log-probs and their gradient are those of whole rows (tests hold them equal).
A step's groups go through in a few such passes (``parts``), each within the
logit memory budget and ``PACK_TOKENS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from echo_learner.training.device import of as device_of
from echo_learner.training.logprobs import TRAIN_BYTES_PER_LOGIT

# Tokens of one pass, padding included: a row's mask is W x W, and every
# query attends over its row's W keys (mostly masked) where a whole row's
# would see only its own prompt and completion.
PACK_TOKENS = 8192


def parts(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], vocab: int, max_bytes: int
) -> list[slice]:
    """Consecutive rows (completions; a group's rows are consecutive) in
    passes whose logits (one per completion token) fit ``max_bytes`` and
    whose tokens fit ``PACK_TOKENS``. A group cut between two passes has its
    prompt in both; a completion too long on its own still gets a pass."""
    found: list[slice] = []
    start, logits, tokens = 0, 0, 0
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        opens = i == start or prompt != prompts[i - 1]
        more = (len(prompt) if opens else 0) + len(completion) - 1
        if i > start and (
            (logits + len(completion)) * vocab * TRAIN_BYTES_PER_LOGIT > max_bytes or tokens + more > PACK_TOKENS
        ):
            found.append(slice(start, i))
            start, logits, tokens = i, 0, 0
            more = len(prompt) + len(completion) - 1
        logits += len(completion)
        tokens += more
    if len(completions):
        found.append(slice(start, len(completions)))
    return found


def packed_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, mask)`` of ``completions[i]`` after ``prompts[i]``, both
    ``[n, longest]``: column j is completion token j, ``mask`` marks real
    tokens; with gradients when the caller has them on. Rows with the same
    prompt in a run are one group, packed in one row of the pass."""
    where = device_of(model)
    runs: list[tuple[Sequence[int], list[int]]] = []
    for i, prompt in enumerate(prompts):
        if runs and runs[-1][0] == prompt:
            runs[-1][1].append(i)
        else:
            runs.append((prompt, [i]))
    width = max(len(p) + sum(len(completions[i]) - 1 for i in rows) for p, rows in runs)
    ids = torch.full((len(runs), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(runs), width), dtype=torch.long)
    owner = torch.full((len(runs), width), -2, dtype=torch.long)  # -1: the prompt; i: completion i; -2: padding
    picks: list[tuple[int, int]] = []  # (row, column) whose logits predict each completion token, in order
    for r, (prompt, rows) in enumerate(runs):
        start = len(prompt)
        ids[r, :start] = torch.tensor(list(prompt))
        positions[r, :start] = torch.arange(start)
        owner[r, :start] = -1
        column = start
        for i in rows:
            rest = list(completions[i][:-1])
            ids[r, column : column + len(rest)] = torch.tensor(rest, dtype=torch.long)
            positions[r, column : column + len(rest)] = torch.arange(start, start + len(rest))
            owner[r, column : column + len(rest)] = i
            picks += [(r, start - 1)] + [(r, column + j) for j in range(len(rest))]
            column += len(rest)
    causal = _causal_lm(model)
    mask = _attention_mask(causal.config, positions, owner)
    hidden = causal.base_model(
        input_ids=ids.to(where),
        attention_mask={k: m.to(where) for k, m in mask.items()} if isinstance(mask, dict) else mask.to(where),
        position_ids=positions.to(where),
        use_cache=False,
    ).last_hidden_state
    rows_at, columns_at = torch.tensor(picks).T.to(where)
    logits = causal.get_output_embeddings()(hidden[rows_at, columns_at])
    cap = getattr(causal.config, "final_logit_softcapping", None)
    if cap:  # Gemma's, as its forward applies it
        logits = torch.tanh(logits / cap) * cap
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    targets = torch.tensor([t for _, rows in runs for i in rows for t in completions[i]], device=where)
    # log_softmax, then the sampled tokens': on the CPU its kernels took 1.1 s
    # of a SmolLM2 step where logsumexp's exp alone took 1.4 s.
    taken = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    lengths = [len(c) for c in completions]
    by_row: list[torch.Tensor] = [taken] * len(completions)
    offset = 0
    for _, rows in runs:
        for i in rows:
            by_row[i] = taken[offset : offset + lengths[i]]
            offset += lengths[i]
    mask_out = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).float().to(where)
    return torch.nn.utils.rnn.pad_sequence(by_row, batch_first=True), mask_out


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (LoRA: its layers are in it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _attention_mask(config, positions: torch.Tensor, owner: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
    """The packed rows' 4D masks ([rows, 1, W, W]): a query sees the keys
    of its own sequence (the prompt and its own completion) at positions up
    to its own; a sliding-window layer's also within the window. A dict by
    layer type for models that mix them, as their forward takes it."""
    query_pos, key_pos = positions[:, :, None], positions[:, None, :]
    query_owner, key_owner = owner[:, :, None], owner[:, None, :]
    seen = (key_pos <= query_pos) & ((key_owner == -1) | (key_owner == query_owner))
    window = getattr(config, "sliding_window", None)
    masks = {"full_attention": seen}
    if window:
        masks["sliding_attention"] = seen & (query_pos - key_pos < window)
    eager = config._attn_implementation == "eager"
    # sdpa takes a boolean mask (True: attend); eager adds it to the scores.
    for kind, allowed in masks.items():
        allowed = allowed[:, None]
        masks[kind] = (
            allowed if not eager else torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        )
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return {kind: masks[kind] for kind in set(layer_types)}
    # One kind for every layer: a window where the config sets one (Mistral's).
    return masks.get("sliding_attention", masks["full_attention"])
