"""Honest rollouts made on a device, checked as a CPU learner checks them.

The learner verifies every batch against its own f32 recompute, within the
tolerance of the (backend, dtype, device) the node declares
(echo_learner/verify/tolerance.py). On a GPU the kernels round differently
from the CPU's: every honest rollout made there must still be accepted.
The policies are bench/policies.py's (untrained, taught the reverse task,
sharpened twice), so that near-certain tokens are checked too.

torch generates in this process; llama.cpp in a child that never imports
torch (bench/llama_child.py). tests/test_gpu.py and bench/gpu.py use it.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from echo_learner.training.model import config_json
from echo_learner.training.trainer import Objective, Trainer
from echo_learner.verify.recompute import logprob_error
from echo_learner.verify.tolerance import tolerance
from echo_learner.verify.verifier import check_logprobs
from protocol.messages import UNSIGNED
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup

PAD, BOS, EOS, SEP = 256, 257, 258, 61
PROMPTS, GROUP, NEW_TOKENS = 4, 16, 16  # a call: 4 prompts x 16 samples of up to 16 tokens
CHILD = Path(__file__).resolve().parent / "llama_child.py"


def weights(model: torch.nn.Module) -> bytes:
    return Trainer(model, lr=0.0, objective=Objective(0.2, 3.0, 0.0), pad_id=PAD).weights()


def plan(models: list[tuple[str, torch.nn.Module]], rollouts: int, seed: int = 0) -> list[list[list[tuple]]]:
    """Each model's calls (lists of prompts), ``rollouts`` in all."""
    rng = random.Random(seed)
    calls = math.ceil(rollouts / len(models) / (PROMPTS * GROUP))
    return [
        [
            [(BOS, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 12))), SEP) for _ in range(PROMPTS)]
            for _ in range(calls)
        ]
        for _ in models
    ]


def on_torch(dtype: str, device: str, models, calls, work_dir: Path) -> tuple[str, list]:
    from echo_node.backend_choice import choose

    backend, _ = choose("torch", dtype, 1, work_dir, device)
    made = []
    for (_, model), prompts in zip(models, calls):
        backend.load(config_json(model), weights(model))
        made.append(
            [
                [[(s.tokens, s.logprobs) for s in g] for g in backend.generate(p, GROUP, NEW_TOKENS, 1.0, (EOS,))]
                for p in prompts
            ]
        )
    backend.close()
    return backend.dtype, made


def on_llama(dtype: str, device: str, models, calls, work_dir: Path) -> tuple[str, list]:
    versions = []
    for k, ((name, model), prompts) in enumerate(zip(models, calls)):
        path = work_dir / f"{k}-{name}.safetensors"
        path.write_bytes(weights(model))
        versions.append(
            {
                "config": config_json(model),
                "weights": str(path),
                "calls": [
                    {"prompts": p, "group": GROUP, "new_tokens": NEW_TOKENS, "temperature": 1.0, "stop": [EOS]}
                    for p in prompts
                ],
            }
        )
    job, answer = work_dir / "job.json", work_dir / "answer.json"
    job.write_text(json.dumps({"kind": "rollouts", "dtype": dtype, "device": device, "versions": versions}))
    done = subprocess.run([sys.executable, str(CHILD), str(job), str(answer)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the llama.cpp child exited {done.returncode}: {done.stderr[-2000:]}")
    seen = json.loads(answer.read_text())
    if seen["torch_imported"]:
        raise RuntimeError("the llama.cpp child imported torch")
    return dtype, seen["versions"]


def honest_rollouts(backend: str, dtype: str, device: str, models, rollouts: int = 2048) -> dict:
    """At least ``rollouts`` made by ``backend`` in ``dtype`` on ``device``
    from ``models`` ((name, model) pairs, on the CPU), each batch checked
    against the CPU recompute within its declared tolerance."""
    calls = plan(models, rollouts)
    with tempfile.TemporaryDirectory(prefix="gpu-rollouts-") as work_dir:
        make = on_llama if backend == "llama" else on_torch
        declared, made = make(dtype, device, models, calls, Path(work_dir))
    allowed = tolerance(backend, declared, device)
    if allowed is None:
        raise ValueError(f"no tolerance row for {backend} {declared} on {device}")
    done, refused, worst, means = 0, [], 0.0, []
    for (name, model), prompts_of, made_of in zip(models, calls, made):
        for prompts, groups in zip(prompts_of, made_of):
            batch = RolloutBatch(
                "gpu",
                0,
                "node",
                b"n" * 16,
                backend,
                declared,
                device,
                1,
                tuple(
                    RolloutGroup(i, tuple(Completion(tuple(t), tuple(lp)) for t, lp in g)) for i, g in enumerate(groups)
                ),
                UNSIGNED,
            )
            error = logprob_error(model, prompts, batch, PAD)
            if check_logprobs(error, allowed) is not None:
                refused.append({"policy": name, "worst": error.worst, "mean": error.mean, "z": error.surprise_z})
            worst, done = max(worst, error.worst), done + sum(len(g) for g in groups)
            means.append(error.mean)
    return {
        "dtype": declared,
        "rollouts": done,
        "refused": len(refused),
        "refused_batches": refused[:3],
        "worst": round(worst, 5),
        "mean": round(sum(means) / len(means), 6),
        "allowed": {"worst": allowed.worst, "mean": allowed.mean},
    }
