"""One training pass's cost: the learner's shared-prompt pass against whole rows.

A GRPO step's forward and backward on SmolLM2-135M-Instruct (``--model
smollm2``): --groups prompts of --prompt-tokens tokens, each with --group-size
completions whose lengths are drawn as the two-term-sums job makes them
(a share --long-share at the answer budget, the rest short). Three ways,
alternated over --repeats rounds in one process, on one torch thread:

- ``rows``: every completion with its prompt, padded to the longest, logits
  at every position (``completion_logprobs``; what TRL's GRPOTrainer does,
  but for its keeping only the completion's logits);
- ``shared``: each prompt once, its KV cache shared by the group's
  completions, all padded to the group's longest;
- ``buckets``: as ``shared``, completions in batches of similar length (the
  learner's ``shared_prompt_logprobs``).

Prints the median seconds of each and their ratios to ``rows``:

    python bench/train_pass.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from echo_learner.training import logprobs  # noqa: E402
from echo_learner.training.model import load_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4, help="prompts per step (default: 4)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (default: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=55, help="prompt length (default: 55)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the answer budget (default: 64)")
    parser.add_argument("--long-share", type=float, default=0.5, help="answers at the budget (default: 0.5)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three (default: 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(0)
    model, tokenizer = load_model("smollm2")
    model.train()
    vocab = model.config.vocab_size
    prompts = [tuple(rng.randrange(1000, vocab) for _ in range(args.prompt_tokens)) for _ in range(args.groups)]
    groups = [
        [
            tuple(
                rng.randrange(1000, vocab)
                for _ in range(
                    args.max_new_tokens if rng.random() < args.long_share else rng.randint(5, args.max_new_tokens // 3)
                )
            )
            for _ in range(args.group_size)
        ]
        for _ in prompts
    ]
    pad = tokenizer.pad_token_id

    def rows() -> None:
        for prompt, completions in zip(prompts, groups):
            lp, mask = logprobs.completion_logprobs(model, [prompt] * len(completions), completions, pad)
            (lp * mask).sum().backward()

    def shared(slack: float) -> None:
        for prompt, completions in zip(prompts, groups):
            lp, mask = logprobs.shared_prompt_logprobs(model, prompt, completions, pad, padding_slack=slack)
            (lp * mask).sum().backward()

    ways = {"rows": rows, "shared": lambda: shared(float("inf")), "buckets": lambda: shared(logprobs.PADDING_SLACK)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, run in ways.items():
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    median = {name: round(statistics.median(s), 3) for name, s in seconds.items()}
    tokens = sum(len(c) for g in groups for c in g)
    result = {
        "seconds": median,
        "ratio_to_rows": {name: round(median[name] / median["rows"], 3) for name in ways},
        "completion_tokens": tokens,
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
