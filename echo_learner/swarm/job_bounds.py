"""Does a job fit the bounds everything downstream enforces? Checked at start,
so that a job nodes would refuse (or that could not be answered within the
wire's frame limit) is refused with one clear line instead of failing later."""

from __future__ import annotations

import random
from collections.abc import Callable

import msgpack

from echo_learner.tasks.base import Task, TaskError, TaskPrompt
from protocol.messages import MAX_PROMPT_TOKENS
from protocol.models.families import context_length
from protocol.schema import to_wire
from protocol.wire.rollout import Completion, RolloutBatch

PROMPT_SAMPLE = 32  # prompts drawn to check that the task's fit the model


def check_prompts_fit(
    task: Task, tokens: Callable[[TaskPrompt], tuple[int, ...]], config: dict, max_new_tokens: int, seed: int
) -> None:
    """Refuse a task whose prompts (a sample of them) leave no room for
    ``max_new_tokens`` in the context nodes run the model with (``config``:
    the model's transformers config), or exceed the wire's limit: nodes
    would refuse every assignment."""
    context = context_length(config, MAX_PROMPT_TOKENS)
    room = min(context - max_new_tokens, MAX_PROMPT_TOKENS)
    rng = random.Random(seed + 1)  # not the learner's: its draws are the training prompts
    longest = max(len(tokens(task.sample(rng))) for _ in range(PROMPT_SAMPLE))
    if longest > room:
        window = ""
        if context < (config.get("max_position_embeddings") or MAX_PROMPT_TOKENS):
            window = (
                f" ({config['model_type']}'s sliding window: llama.cpp attends past it where transformers "
                "does not, so a prompt and its answer must fit within it)"
            )
        raise TaskError(
            f"task {task.name}: prompts of up to {longest} tokens do not fit: the model's context is "
            f"{context} tokens{window} with --max-new-tokens {max_new_tokens}, and prompts may have at "
            f"most {MAX_PROMPT_TOKENS} tokens (choose a bigger model, e.g. --model smollm2, or a smaller task)"
        )


def largest_answer_bytes(prompts: int, group_size: int, max_new_tokens: int, vocab_size: int) -> int:
    """Encoded size of the largest rollout batch an honest node can send for
    one assignment: every completion at the answer budget, with the widest
    token ids and log-probs (a completion's bytes, measured, times their number,
    plus a generous allowance for the batch's other fields)."""
    widest = Completion(tokens=(vocab_size - 1,) * max_new_tokens, logprobs=(-1234.5678,) * max_new_tokens)
    per_completion = len(msgpack.packb(to_wire(widest), use_bin_type=True))
    return prompts * group_size * (per_completion + 16) + 1024


def check_answers_fit(prompts_per_request: int, group_size: int, max_new_tokens: int, vocab_size: int) -> None:
    """Refuse a job whose full answers to one assignment could exceed the
    rollout protocol's frame limit: honest nodes' batches would be cut off."""
    size = largest_answer_bytes(prompts_per_request, group_size, max_new_tokens, vocab_size)
    if size > RolloutBatch.MAX_BYTES:
        raise TaskError(
            f"answers to one assignment ({prompts_per_request} prompts x {group_size} completions x "
            f"{max_new_tokens} tokens) could take {size / 2**20:.1f} MiB, over the rollout frame limit of "
            f"{RolloutBatch.MAX_BYTES / 2**20:.0f} MiB: lower --prompts-per-request, --group-size or --max-new-tokens"
        )
