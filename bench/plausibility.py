"""Verification on real backends: zero false rejects on honest rollouts, forgers caught.

For each backend and dtype the learner accepts (torch f32, f16, bf16; llama.cpp
f32, f16 and q8_0 when llama-cpp-python is installed), real rollouts are
sampled from a model on ``--device`` (the CPU by default; a GPU to calibrate
its tolerances, echo_learner/verify/tolerance.py) and judged exactly as a learner
judges them: the per-batch bounds (``logprob_error`` + ``check_logprobs``
with the tolerance of the declared backend, dtype and device) and the
evidence over all of one node's batches (``echo_learner.verify.evidence``: the
precision test against the declared arithmetic, recomputed for the batches the
learner would pick, and the sampler tests). Any refusal is a false reject.

Models (``--models``): ``builtin`` (the built-in model at three versions,
sharpened x2 and x3: the hardest cases for rounding), ``smollm2``
(SmolLM2-135M-Instruct answering two-term sums at temperature 0.7, its chat
template), ``qwen3-0.6b`` (Qwen3-0.6B's shape, random bf16 weights) and the
tiny random model of any family (``llama``, ``qwen2``, ``qwen3``, ``mistral``,
``gemma2``, ``gemma3_text``: tests/families.py).

Then three forgers that report the learner's *exact* log-probs for tokens
that were not sampled from the policy (chosen at random, sampled from another
version, greedy) are verified under the loosest tolerance (llama q8_0).

    python bench/plausibility.py --json                                 # built-in, >= 10,000 rollouts per row
    python bench/plausibility.py --models smollm2 --rollouts 1000 --json
    python bench/plausibility.py --device cuda --json                   # the same rollouts made on a GPU

Prints per model, backend and dtype: rollouts, false_rejects (must be 0), the
largest |log-prob difference| and batch mean seen, the mean per token, the
batches' distance over the emulation's (``emulated_ratio``), the highest each
evidence test reached, and the limits; per forger: the fraction of batches caught.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from echo_learner.training.logprobs import grouped_logprobs  # noqa: E402
from echo_learner.training.lora import state_bytes  # noqa: E402
from echo_learner.training.model import ModelShape, build_model, config_json  # noqa: E402
from echo_learner.verify.emulate import Emulations, can_emulate  # noqa: E402
from echo_learner.verify.evidence import SAMPLER_TESTS, EvidenceBook, EvidenceLimits  # noqa: E402
from echo_learner.verify.recompute import logprob_error  # noqa: E402
from echo_learner.verify.tolerance import tolerance  # noqa: E402
from echo_learner.verify.verifier import check_logprobs  # noqa: E402
from protocol.messages import UNSIGNED  # noqa: E402
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup  # noqa: E402

PAD, BOS, EOS, SEP = 256, 257, 258, 61
GROUP = 16
PROMPTS = 4
MATH = "math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1"


@dataclass
class Subject:
    """A model honest nodes generate from: its versions (as the learner holds
    them), the prompts of its task and how answers are sampled."""

    name: str
    versions: list[torch.nn.Module]
    prompts: Callable[[random.Random], list[tuple[int, ...]]]
    pad: int
    stops: tuple[int, ...]
    temperature: float = 1.0
    group: int = GROUP
    max_new: int = 16
    family: str = "llama"


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


def prompts_for(rng: random.Random) -> list[tuple[int, ...]]:
    return [(BOS, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 12))), SEP) for _ in range(PROMPTS)]


def subject(name: str, work_dir: Path) -> Subject:
    """The model ``--models`` names."""
    if name == "builtin":
        return Subject(name, versions(), prompts_for, PAD, (EOS,))
    if name == "smollm2":
        from echo_learner.tasks.registry import load_task
        from echo_learner.training.model import load_model, render_prompt, stop_ids

        model, tokenizer = load_model("smollm2")
        task = load_task(MATH)
        return Subject(
            name,
            [model],
            lambda rng: [render_prompt(tokenizer, task.sample(rng).text, task.system_prompt) for _ in range(2)],
            tokenizer.pad_token_id,
            tuple(sorted(stop_ids(tokenizer))),
            temperature=0.7,
            group=8,
            max_new=32,
        )
    if name == "qwen3-0.6b":
        from models import save_qwen3_0_6b  # bench/models.py
        from transformers import AutoModelForCausalLM

        save_qwen3_0_6b(work_dir / "qwen3-0.6b")
        model = AutoModelForCausalLM.from_pretrained(work_dir / "qwen3-0.6b", dtype=torch.float32).eval()
        return Subject(name, [model], lambda rng: prompts_for(rng)[:2], PAD, (EOS,), group=8, family="qwen3")
    from tests.families import FAMILIES, tiny_model

    if name not in FAMILIES:
        raise SystemExit(f"--models: {name} is none of builtin, smollm2, qwen3-0.6b, {', '.join(FAMILIES)}")
    return Subject(name, [tiny_model(name)], prompts_for, PAD, (EOS,), family=name)


def backend_for(name: str, dtype: str, device: str, work_dir: Path):  # type: ignore[no-untyped-def]
    from echo_node.backend_choice import choose

    backend, _ = choose(name, dtype, 1, work_dir / f"{name}-{dtype}", device)
    return backend


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
    subject: Subject, name: str, dtype: str, device: str, rollouts: int, rng: random.Random, work_dir: Path
) -> dict:
    """``rollouts`` honest rollouts of ``subject`` from backend ``name`` in
    ``dtype``, judged as the learner judges one node's batches."""
    backend = backend_for(name, dtype, device, work_dir)
    declared = (name, dtype, backend.device.kind)
    allowed = tolerance(*declared, family=subject.family)
    book = EvidenceBook(EvidenceLimits(), max_peers=4)
    emulations = Emulations()
    done, tokens, off, false_rejects, reasons = 0, 0, 0.0, 0, {}
    worst, worst_mean, most_z, ratios, highest = 0.0, 0.0, 0.0, [], dict.fromkeys(("precision", *SAMPLER_TESTS), 0.0)
    for k, model in enumerate(subject.versions):
        backend.load(config_json(model), state_bytes(model))
        while done < rollouts * (k + 1) / len(subject.versions):
            prompts = subject.prompts(rng)
            groups = backend.generate(prompts, subject.group, subject.max_new, subject.temperature, subject.stops)
            batch = as_batch(
                name, dtype, [[(s.tokens, tuple(s.logprobs)) for s in g] for g in groups], backend.device.kind
            )
            twin = None
            if can_emulate(*declared) and book.wants_emulation("node", declared):
                twin = emulations.get(k, model, name, dtype)
            error = logprob_error(model, prompts, batch, subject.pad, temperature=subject.temperature, emulation=twin)
            reason = check_logprobs(error, allowed) or book.add("node", declared, error.evidence)
            if reason is not None:
                false_rejects += 1
                reasons[reason] = reasons.get(reason, 0) + 1
                book = EvidenceBook(EvidenceLimits(), max_peers=4)  # judged afresh, as a new node
            evidence = error.evidence
            if evidence.emulated_off:
                ratios.append(evidence.reported_off / evidence.emulated_off)
            row = book.row("node", declared)
            for test, value in (("precision", row.precision), *row.sampler.items()):
                highest[test] = max(highest[test], value)
            worst, worst_mean = max(worst, error.worst), max(worst_mean, error.mean)
            most_z = max(most_z, abs(error.surprise_z))
            tokens += evidence.tokens
            off += evidence.reported_off
            done += sum(len(g) for g in groups)
    backend.close()
    limits = EvidenceLimits()
    return {
        "rollouts": done,
        "tokens": tokens,
        "false_rejects": false_rejects,
        **({"reasons": reasons} if reasons else {}),
        "device": backend.device.kind,
        "worst_logprob_diff": round(worst, 6),
        "tolerance_worst": allowed.worst,
        "worst_batch_mean": round(worst_mean, 6),
        "tolerance_mean": allowed.mean,
        "mean_logprob_diff": round(off / max(tokens, 1), 6),
        "max_abs_z": round(most_z, 2),
        "z_limit": allowed.z,
        **(
            {"emulated_ratio": [round(min(ratios), 3), round(max(ratios), 3)], "emulated_batches": len(ratios)}
            if ratios
            else {}
        ),
        "evidence_highest": {k: round(v, 2) for k, v in highest.items()},
        "evidence_limits": {"precision": limits.precision_limit, "sampler": limits.sampler_limit},
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
        sampler.load(config_json(other), state_bytes(other))
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


def rows(device: str) -> list[tuple[str, str]]:
    """The (backend, dtype) rows to measure: torch's, and llama.cpp's when installed."""
    kinds = [("torch", d) for d in ("f32", "f16", "bf16")] if device != "vulkan" else []
    try:
        import llama_cpp  # noqa: F401

        kinds += [("llama", d) for d in ("f32", "f16", "q8_0")]
    except ImportError:
        print("llama-cpp-python is not installed: torch only", file=sys.stderr)
    return kinds


def measure(models: list[str], rollouts: dict[str, int], device: str, rng: random.Random, log: bool) -> dict:
    """``honest`` for every model and row: {model: {"backend/dtype": result}}."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            s = subject(model, Path(tmp))
            out[model] = {}
            for name, dtype in rows(device):
                result = honest(s, name, dtype, device, rollouts[model], rng, Path(tmp) / model)
                out[model][f"{name}/{dtype}"] = result
                if log:
                    print(f"{model} {name}/{dtype}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return out


def per_model(text: str, models: list[str]) -> dict[str, int]:
    """``--rollouts``: one number for every model, or model=number pairs."""
    if "=" not in text:
        return dict.fromkeys(models, int(text))
    given = {k: int(v) for k, v in (part.split("=") for part in text.split(","))}
    return {m: given.get(m, 10_000) for m in models}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="builtin", help="comma-separated: builtin, smollm2, qwen3-0.6b, a family")
    parser.add_argument(
        "--rollouts", default="10000", help="honest rollouts per backend/dtype (or model=N,...; default 10,000)"
    )
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
    models = [m for m in args.models.split(",") if m]
    started = time.monotonic()
    out: dict = {"honest": measure(models, per_model(args.rollouts, models), args.device, rng, not args.json)}
    out["forgers_caught_at_q8_0_tolerance"] = forgers(args.forger_batches, 16, rng)
    out["false_rejects"] = sum(r["false_rejects"] for m in out["honest"].values() for r in m.values())
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
