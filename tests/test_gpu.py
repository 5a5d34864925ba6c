"""On a GPU (marked ``gpu``; skipped where torch sees no CUDA device, as on CI):
the learner trains and verifies there as it does on the CPU, and a CPU
learner accepts every honest rollout a GPU node makes (the tolerances of
echo_learner/verify/tolerance.py hold for GPU kernels). The policies are
bench/policies.py's, trained to near-determinism among them: log-probs of
near-certain tokens are where rounding shows.

llama.cpp runs in a child process that never imports torch, as a llama.cpp
node does (bench/llama_child.py): torch's CUDA beside llama.cpp's crashed its
model load on an H200 (issue 71).

    pytest -m gpu -rs          # or every GPU check at once: python bench/gpu.py
"""

import subprocess
import sys

import pytest
import torch
from gpu_rollouts import PAD, honest_rollouts
from policies import policies

from echo_learner.training.device import choose as learner_device
from echo_learner.training.logprobs import grouped_token_stats
from echo_learner.training.model import build_model
from echo_learner.training.trainer import Objective, Passes, ScoredGroup, Trainer
from echo_node.backend_choice import llama_installed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (run on a GPU machine: pytest -m gpu)"),
]
OBJ = Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.0)
BOS, EOS, SEP = 257, 258, 61


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


def one_step(trained: torch.nn.Module, device: str) -> tuple[float, dict, dict]:
    """One training step of a copy of ``trained`` on ``device``: its loss,
    gradients (as clipped for the step) and weights after the step, on the CPU."""
    model = build_model()
    model.load_state_dict(trained.state_dict())
    where, _ = learner_device(device)
    model = model.to(where)
    stats = Trainer(model, lr=1e-3, objective=OBJ, pad_id=PAD).step(scored_groups(0))
    grads = {k: p.grad.detach().cpu() for k, p in model.named_parameters() if p.grad is not None}
    return stats.loss, grads, {k: p.detach().cpu() for k, p in model.named_parameters()}


def test_a_training_step_on_the_gpu_equals_one_on_the_cpu(trained):
    """Losses and gradients agree; weights where the gradient is clearly
    non-zero. AdamW's first step moves a weight by lr * g / (|g| + eps), so
    where g is near zero a 1e-10 difference between the devices' gradients
    moves it by up to 2 lr: there the weights say nothing about the devices."""
    loss_cpu, grads_cpu, weights_cpu = one_step(trained, "cpu")
    loss_gpu, grads_gpu, weights_gpu = one_step(trained, "cuda")
    assert abs(loss_cpu - loss_gpu) < 1e-5
    assert grads_cpu.keys() == grads_gpu.keys() and grads_cpu
    for name, g in grads_cpu.items():
        scale = g.abs().max().item()
        assert torch.allclose(g, grads_gpu[name], rtol=1e-3, atol=1e-5 * scale + 1e-9), name
        clear = g.abs() > 1e-3 * scale  # well above the devices' disagreement
        assert clear.any(), name
        assert torch.allclose(weights_cpu[name][clear], weights_gpu[name][clear], atol=1e-5), name


def test_the_learners_recompute_on_the_gpu_equals_the_cpus(trained):
    prompts = [(BOS, 97, 98, SEP), (BOS, 99, SEP)]
    groups = [[(98, 97, EOS), (99,)], [(99, EOS)]]
    for name, model in policies(trained):
        on_cpu = grouped_token_stats(model, prompts, groups, PAD)
        on_gpu = grouped_token_stats(model.to("cuda"), prompts, groups, PAD)
        model.to("cpu")
        for a, b in zip(sum(on_cpu, []), sum(on_gpu, [])):
            assert b.logprobs.device.type == "cpu"  # the checks compare on the CPU
            assert torch.allclose(a.logprobs, b.logprobs, atol=1e-4), name


@pytest.mark.parametrize("dtype", ["f32", "auto"])
def test_a_cpu_learner_accepts_every_honest_torch_rollout_made_on_the_gpu(dtype, trained):
    result = honest_rollouts("torch", dtype, "cuda", list(policies(trained)))
    assert result["rollouts"] >= 2000 and result["refused"] == 0, result


def llama_has_cuda() -> bool:
    """Asked in a child: this process has torch's CUDA, which llama.cpp must not meet."""
    done = subprocess.run(
        [sys.executable, "-c", "from echo_node.backend_llama import gpu_kinds; print('cuda' in gpu_kinds())"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() == "True"


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_a_cpu_learner_accepts_every_honest_llama_rollout_made_on_the_gpu(dtype, trained):
    if not llama_installed() or not llama_has_cuda():
        pytest.skip("llama.cpp here was built without CUDA (../shared/gpu/check.sh builds it with)")
    result = honest_rollouts("llama", dtype, "cuda", list(policies(trained)))
    assert result["rollouts"] >= 2000 and result["refused"] == 0, result


def test_a_bf16_training_step_on_the_gpu_is_near_the_f32_one(trained):
    """The learner trains under bf16 autocast on a GPU (--train-precision auto):
    the loss near f32's, every weight still f32 after the step."""
    losses = {}
    for precision in ("f32", "bf16"):
        model = build_model()
        model.load_state_dict(trained.state_dict())
        model = model.to("cuda")
        losses[precision] = (
            Trainer(model, lr=1e-3, objective=OBJ, pad_id=PAD, passes=Passes(precision=precision))
            .step(scored_groups(0))
            .loss
        )
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert abs(losses["bf16"] - losses["f32"]) < 0.02 * abs(losses["f32"]) + 1e-3, losses
