"""Verification on real backends: zero false rejects on honest rollouts, forgers caught.

For each backend and dtype the learner accepts (torch f32, f16, bf16; llama.cpp
f32, f16 and q8_0 when llama-cpp-python is installed), real rollouts are
sampled from the built-in model at several versions (initial, sharpened x2
and x3: the hardest cases for rounding) on ``--device`` (the CPU by default;
a GPU to calibrate its tolerances, echo_learner/tolerance.py) and verified
exactly as a learner on the CPU does (``logprob_error`` + ``check_logprobs``
with the tolerance of the declared backend, dtype and device). Then three
forgers that report the learner's *exact* log-probs for tokens that were not
sampled from the policy (chosen at random, sampled from another version,
greedy) are verified under the loosest tolerance (llama q8_0).

    python bench/plausibility.py --json          # >= 10,000 rollouts per backend/dtype
    python bench/plausibility.py --device cuda --json   # the same rollouts made on a GPU

Prints per backend/dtype: rollouts, false_rejects (must be 0), the largest
|log-prob difference| and |surprise z| seen, and the limits; per forger: the
fraction of batches caught.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from echo_learner.logprobs import grouped_logprobs  # noqa: E402
from echo_learner.model import ModelShape, build_model, config_json  # noqa: E402
from echo_learner.recompute import logprob_error  # noqa: E402
from echo_learner.tolerance import tolerance  # noqa: E402
from echo_learner.trainer import Objective, Trainer  # noqa: E402
from echo_learner.verify import check_logprobs  # noqa: E402
from protocol.messages import UNSIGNED  # noqa: E402
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup  # noqa: E402

PAD, BOS, EOS, SEP = 256, 257, 258, 61
GROUP = 16
PROMPTS = 4


def versions() -> list[torch.nn.Module]:
    """Policies as different as successive versions, sharpened so that some
    tokens are near-certain and others unlikely."""
    out = []
    for seed in range(3):
        model = build_model(ModelShape(seed=seed))
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 + seed)
        out.append(model.eval())
    return out


def backend_for(name: str, dtype: str, device: str, work_dir: Path):  # type: ignore[no-untyped-def]
    from echo_node.backend_choice import choose

    backend, _ = choose(name, dtype, 1, work_dir / f"{name}-{dtype}", device)
    return backend


def prompts_for(rng: random.Random) -> list[tuple[int, ...]]:
    return [(BOS, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 12))), SEP) for _ in range(PROMPTS)]


def as_batch(
    backend: str,
    dtype: str,
    groups: list[list[tuple[tuple[int, ...], tuple[float, ...]]]],
    device: str = "cpu",
) -> RolloutBatch:
    return RolloutBatch(
        "bench",
        0,
        "node",
        b"n" * 16,
        backend,
        dtype,
        device,
        1,
        tuple(RolloutGroup(i, tuple(Completion(t, lp) for t, lp in g)) for i, g in enumerate(groups)),
        UNSIGNED,
    )


def honest(
    name: str,
    dtype: str,
    device: str,
    rollouts: int,
    max_new: int,
    rng: random.Random,
    work_dir: Path,
) -> dict:
    backend = backend_for(name, dtype, device, work_dir)
    allowed = tolerance(name, dtype, backend.device.kind)
    done, false_rejects, worst, worst_mean, most_z, reasons = 0, 0, 0.0, 0.0, 0.0, {}
    models = versions()
    for k, model in enumerate(models):
        backend.load(
            config_json(model), Trainer(model, lr=0.0, objective=Objective(0.2, 3.0, 0.0), pad_id=PAD).weights()
        )
        while done < rollouts * (k + 1) / len(models):
            prompts = prompts_for(rng)
            groups = backend.generate(prompts, GROUP, max_new, 1.0, (EOS,))
            batch = as_batch(
                name, dtype, [[(s.tokens, tuple(s.logprobs)) for s in g] for g in groups], backend.device.kind
            )
            error = logprob_error(model, prompts, batch, PAD)
            worst_mean = max(worst_mean, error.mean)
            reason = check_logprobs(error, allowed)
            if reason is not None:
                false_rejects += 1
                reasons[reason] = reasons.get(reason, 0) + 1
            worst, most_z = max(worst, error.worst), max(most_z, abs(error.surprise_z))
            done += sum(len(g) for g in groups)
    return {
        "rollouts": done,
        "false_rejects": false_rejects,
        **({"reasons": reasons} if reasons else {}),
        "device": backend.device.kind,
        "worst_logprob_diff": round(worst, 6),
        "tolerance_worst": allowed.worst,
        "worst_batch_mean": round(worst_mean, 6),
        "tolerance_mean": allowed.mean,
        "max_abs_z": round(most_z, 2),
        "z_limit": allowed.z,
    }


def forgers(batches: int, max_new: int, rng: random.Random) -> dict:
    """Exact log-probs of tokens not sampled from the policy, under q8_0's tolerance."""
    from echo_node.backend_torch import TorchBackend

    # A sharpened policy, as after training (under a near-uniform one any
    # token is about as likely as a sampled one: nothing to catch).
    other, policy = versions()[1:]
    sampler = TorchBackend(threads=1)
    caught = {"chosen": 0, "other_model": 0, "greedy": 0}
    for _ in range(batches):
        prompts = prompts_for(rng)
        sampler.load(
            config_json(other), Trainer(other, lr=0.0, objective=Objective(0.2, 3.0, 0.0), pad_id=PAD).weights()
        )
        swapped = [[s.tokens for s in g] for g in sampler.generate(prompts, GROUP, max_new, 1.0, (EOS,))]
        shape = [[len(t) for t in g] for g in swapped]
        chosen = [[tuple(rng.randrange(0, PAD) for _ in range(n)) for n in g] for g in shape]
        greedy = []
        for p, g in zip(prompts, shape):
            with torch.no_grad():
                out = policy.generate(torch.tensor([p]), max_new_tokens=max(g), do_sample=False, pad_token_id=PAD)[
                    0, len(p) :
                ]
            greedy.append([tuple(out[:n].tolist()) for n in g])
        for name, tokens in (("chosen", chosen), ("other_model", swapped), ("greedy", greedy)):
            lps = grouped_logprobs(policy, prompts, tokens, PAD)
            batch = as_batch(
                "llama",
                "q8_0",
                [[(t, tuple(float(x) for x in lp)) for t, lp in zip(g, gl)] for g, gl in zip(tokens, lps)],
            )
            if check_logprobs(logprob_error(policy, prompts, batch, PAD), tolerance("llama", "q8_0")) is not None:
                caught[name] += 1
    return {name: round(n / batches, 3) for name, n in caught.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=10_000, help="honest rollouts per backend/dtype")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--forger-batches", type=int, default=50)
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda", "mps", "vulkan"),
        help="where the honest rollouts are made (the learner's recompute stays on the CPU)",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    rng = random.Random(0)
    torch.manual_seed(0)
    kinds = [("torch", d) for d in ("f32", "f16", "bf16")] if args.device != "vulkan" else []
    try:
        import llama_cpp  # noqa: F401

        kinds += [("llama", d) for d in ("f32", "f16", "q8_0")]
    except ImportError:
        print("llama-cpp-python is not installed: torch only", file=sys.stderr)
    started = time.monotonic()
    out: dict = {"honest": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype in kinds:
            result = honest(name, dtype, args.device, args.rollouts, args.max_new_tokens, rng, Path(tmp))
            out["honest"][f"{name}/{dtype}"] = result
            if not args.json:
                print(f"{name}/{dtype}: {json.dumps(result)}", file=sys.stderr, flush=True)
    out["forgers_caught_at_q8_0_tolerance"] = forgers(args.forger_batches, args.max_new_tokens, rng)
    out["false_rejects"] = sum(r["false_rejects"] for r in out["honest"].values())
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
