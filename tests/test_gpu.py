"""On a GPU (marked ``gpu``; skipped where torch sees no CUDA device, as on CI):
the learner trains and verifies there as it does on the CPU, and a CPU
learner accepts every honest rollout a GPU node makes (the tolerances of
echo_learner/verify/tolerance.py hold for GPU kernels).

    pytest -m gpu -rs
"""

import random

import pytest
import torch

from echo_learner.training.logprobs import grouped_token_stats
from echo_learner.training.model import build_model, config_json
from echo_learner.training.trainer import Objective, ScoredGroup, Trainer
from echo_learner.verify.recompute import logprob_error
from echo_learner.verify.tolerance import tolerance
from echo_learner.verify.verifier import check_logprobs
from echo_node.backend_choice import choose, llama_installed
from echo_node.backend_llama import gpu_kind as llama_gpu_kind
from protocol.messages import UNSIGNED
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup
from tests.learner.test_logprob_check import versions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (run on a GPU machine: pytest -m gpu)"),
]
OBJ = Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.0)
PAD, BOS, EOS, SEP = 256, 257, 258, 61


def scored_groups(seed: int) -> list[ScoredGroup]:
    g = torch.Generator().manual_seed(seed)
    groups = []
    for p in range(4):
        prompt = (BOS, *(int(x) for x in torch.randint(97, 101, (3 + p,), generator=g)), SEP)
        completions = tuple(tuple(int(x) for x in torch.randint(0, 259, (8,), generator=g)) for _ in range(8))
        groups.append(
            ScoredGroup(
                prompt,
                completions,
                tuple(tuple(-2.0 for _ in c) for c in completions),
                tuple(float(x) for x in torch.rand(8, generator=g)),
            )
        )
    return groups


def test_a_training_step_on_the_gpu_equals_one_on_the_cpu():
    groups = scored_groups(0)
    results = {}
    for device in ("cpu", "cuda"):
        from echo_learner.training.device import choose as learner_device

        where, _ = learner_device(device)
        model = build_model().to(where)
        stats = Trainer(model, lr=1e-3, objective=OBJ, pad_id=PAD).step(groups)
        results[device] = (stats, {k: v.detach().cpu() for k, v in model.state_dict().items()})
    (cpu, w_cpu), (gpu, w_gpu) = results["cpu"], results["cuda"]
    assert abs(cpu.loss - gpu.loss) < 1e-5 and cpu.tokens == gpu.tokens
    assert all(torch.allclose(w_cpu[k], w_gpu[k], atol=1e-5) for k in w_cpu)


def test_the_learners_recompute_on_the_gpu_equals_the_cpus():
    model = next(versions(3))
    prompts = [(BOS, 97, 98, SEP), (BOS, 99, SEP)]
    groups = [[(97, 98, EOS), (99,)], [(100, 100, 100, EOS)]]
    on_cpu = grouped_token_stats(model, prompts, groups, PAD)
    on_gpu = grouped_token_stats(model.to("cuda"), prompts, groups, PAD)
    for a, b in zip(sum(on_cpu, []), sum(on_gpu, [])):
        assert b.logprobs.device.type == "cpu"  # the checks compare on the CPU
        assert torch.allclose(a.logprobs, b.logprobs, atol=1e-4)


def honest_rollouts_on_the_gpu(backend_name: str, dtype: str, tmp_path, rollouts: int = 2048) -> dict:
    """Rollouts a GPU node makes, verified by a CPU learner."""
    backend, _ = choose(backend_name, dtype, 1, tmp_path, "cuda")
    allowed = tolerance(backend_name, backend.dtype, backend.device.kind)
    assert allowed is not None
    rng = random.Random(0)
    done, refused = 0, []
    models = list(versions(3))
    for k, model in enumerate(models):
        backend.load(config_json(model), Trainer(model, lr=0.0, objective=OBJ, pad_id=PAD).weights())
        while done < rollouts * (k + 1) / len(models):
            prompts = [(BOS, *(rng.randrange(97, 101) for _ in range(rng.randint(1, 12))), SEP) for _ in range(4)]
            groups = backend.generate(prompts, 16, 16, 1.0, (EOS,))
            batch = RolloutBatch(
                "gpu",
                0,
                "node",
                b"n" * 16,
                backend_name,
                backend.dtype,
                backend.device.kind,
                1,
                tuple(
                    RolloutGroup(i, tuple(Completion(s.tokens, s.logprobs) for s in g)) for i, g in enumerate(groups)
                ),
                UNSIGNED,
            )
            error = logprob_error(model, prompts, batch, PAD)
            if check_logprobs(error, allowed) is not None:
                refused.append(error)
            done += sum(len(g) for g in groups)
    return {"rollouts": done, "refused": refused}


@pytest.mark.parametrize("dtype", ["f32", "auto"])
def test_a_cpu_learner_accepts_every_honest_torch_rollout_made_on_the_gpu(dtype, tmp_path):
    result = honest_rollouts_on_the_gpu("torch", dtype, tmp_path)
    assert result["rollouts"] >= 2000 and not result["refused"], result["refused"][:3]


@pytest.mark.skipif(
    not llama_installed() or llama_gpu_kind() != "cuda",
    reason="llama.cpp here was built without CUDA (../shared/gpu/build-llama-cuda.sh)",
)
@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_a_cpu_learner_accepts_every_honest_llama_rollout_made_on_the_gpu(dtype, tmp_path):
    result = honest_rollouts_on_the_gpu("llama", dtype, tmp_path)
    assert result["rollouts"] >= 2000 and not result["refused"], result["refused"][:3]
