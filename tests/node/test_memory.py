"""A node sizes its work to its memory: estimates above what generation
really allocates, a smaller dtype or fewer prompts per call when that fits,
one clear line when nothing does."""

import json
import os
import subprocess
import sys

import pytest
from gpu import SMOLLM2_SHAPE

from echo_node.backend_choice import spec_of
from echo_node.backend_llama import LLAMA_CELLS
from echo_node.memory import (
    call_need,
    choose_dtype,
    gpu_cells,
    gpu_layers,
    load_need,
    prompts_per_call,
)
from echo_node.model_shape import model_shape
from echo_node.refusals import Refused

LLAMA, TORCH = spec_of("llama"), spec_of("torch")

# SmolLM2-135M-Instruct's shape (its GGUF's config), without loading it.
SMOLLM2 = json.dumps(SMOLLM2_SHAPE)

# Peak RSS growth of one torch generate call, in a fresh process, next to the
# estimate for the same call.
PROBE = """
import json, sys
import psutil, torch
from safetensors.torch import save
from transformers import LlamaConfig, LlamaForCausalLM
from echo_node.backend_torch import TorchBackend
from echo_node.model_shape import model_shape
from echo_node.backend_choice import spec_of
from echo_node.memory import call_need

prompts, group, new, vocab, first_prompts, first_length = (int(a) for a in sys.argv[1:7])
config = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=256, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                     tie_word_embeddings=True)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
config_json = json.dumps(model.config.to_dict())
backend = TorchBackend(threads=1)
backend.load(config_json, save({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}))
del model
# Allocator and kernels warmed up, by a call that may be longer than the measured one.
backend.generate([tuple(range(1, first_length + 1))] * first_prompts, group, 4, 1.0, ())
before = psutil.Process().memory_info().rss
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS (VmHWM) starts again from now: loading's peak is not the call's
backend.generate([tuple(range(1, 17))] * prompts, group, new, 1.0, ())  # no stop token: every token generated
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024
need = call_need(model_shape(config_json), spec_of("torch"), prompts * group, 16, new)
print(json.dumps({"grew": peak - before, "estimate": need.total, "cache": need.cache, "buffers": need.buffers}))
"""


def probe(*sizes: int) -> dict:
    """PROBE's figures for one call (prompts, group, new, vocab) after a
    first call of (first_prompts, first_length)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, sizes)],
        # Large tensors in their own mappings, returned when freed: with
        # glibc's sliding threshold the same call's peak RSS growth read
        # 77-194 MB run to run, a figure of the heap's history, not the call.
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# One call dominated by its logits (a large vocabulary), one by its KV cache
# (long generations).
@pytest.mark.heavy  # ~15 s each: a real generation's peak memory, measured in a process of its own
@pytest.mark.parametrize("prompts, group, new, vocab", [(8, 8, 48, 65536), (4, 8, 480, 4096)])
def test_the_estimate_holds_what_torch_generation_really_allocates(prompts, group, new, vocab):
    seen = probe(prompts, group, new, vocab, prompts, 3)
    print(seen)
    assert seen["grew"] > 100 * 2**20  # the call allocates enough to measure
    assert seen["grew"] <= seen["estimate"] <= 3 * seen["grew"], seen  # above, and not absurdly


def test_each_torch_call_gets_a_cache_of_its_own_size():
    """A call with more rows and shorter prompts than the one before it: a
    cache kept between calls (transformers' static cache grows to the longest
    length seen) would hold 64 rows x 1,000 tokens, 40 x the estimate."""
    seen = probe(8, 8, 8, 4096, 1, 1000)
    print(seen)
    assert seen["grew"] <= seen["estimate"], seen


def test_dtype_auto_takes_the_most_exact_that_fits():
    shape = model_shape(SMOLLM2)
    need = {d: (load_need(shape, LLAMA, d) + call_need(shape, LLAMA, 1, 0, 1)).total for d in ("f32", "f16", "q8_0")}
    assert need["f32"] > need["f16"] > need["q8_0"]
    assert choose_dtype(shape, LLAMA, "auto", need["f32"]) == "f32"
    assert choose_dtype(shape, LLAMA, "auto", need["f32"] - 1) == "f16"
    assert choose_dtype(shape, LLAMA, "auto", need["f16"] - 1) == "q8_0"
    with pytest.raises(Refused, match=r"needs about .* \(weights .* with llama q8_0; .* is free"):
        choose_dtype(shape, LLAMA, "auto", need["q8_0"] - 1)
    # An explicit dtype is checked, never changed; torch is told where smaller lives.
    with pytest.raises(Refused, match="with llama f32"):
        choose_dtype(shape, LLAMA, "f32", need["f32"] - 1)
    torch_f32 = (load_need(shape, TORCH, "f32") + call_need(shape, TORCH, 1, 0, 1)).total
    assert choose_dtype(shape, TORCH, "auto", torch_f32) == "f32"
    with pytest.raises(Refused, match="--backend llama --dtype auto"):
        choose_dtype(shape, TORCH, "auto", torch_f32 - 1)


def test_an_assignment_is_generated_in_calls_that_fit():
    shape = model_shape(SMOLLM2)
    one = call_need(shape, TORCH, 16, 40, 256).total  # one prompt's group of 16 long answers
    # Its KV cache and one step's logits in a few copies: a quarter GiB (when
    # torch kept every step's logits, over one GiB).
    assert 2**27 < one < 2**29
    assert prompts_per_call(shape, TORCH, 8, 16, 40, 256, free=8 * one) == 8
    assert prompts_per_call(shape, TORCH, 8, 16, 40, 256, free=int(2.5 * one)) == 2
    with pytest.raises(Refused, match="one prompt's group of 16 x 256 tokens needs about"):
        prompts_per_call(shape, TORCH, 8, 16, 40, 256, free=one - 1)
    # llama.cpp's KV cache comes with the model: a call needs only logits rows.
    assert prompts_per_call(shape, LLAMA, 8, 16, 40, 256, free=one) == 8


def test_gpu_offload_takes_the_layers_that_fit():
    shape = model_shape(SMOLLM2)
    whole = load_need(shape, LLAMA, "f16").total
    assert gpu_layers(shape, "f16", 10 * whole, LLAMA_CELLS) == -1  # all of them
    assert 0 < gpu_layers(shape, "f16", whole // 4, LLAMA_CELLS) < shape.layers
    assert gpu_layers(shape, "f16", 0, LLAMA_CELLS) == 0


@pytest.mark.procs  # a learner and a node
def test_a_node_refuses_a_job_its_memory_cannot_hold(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    swarm.start_learner("--steps", "1000")
    # All of it inside the 0.5 GiB kept free. Joined without an invite, the
    # node looks for a job that fits until its discovery timeout (a job too
    # big may be a decoy's), then says why it took none.
    node = swarm.start_node(0, "--max-memory", "0.5", "--discovery-timeout-s", "15")
    assert node.wait(timeout=120) == 2  # the CLI's exit code for a refusal
    log = (swarm.root / "node0.log").read_text()
    assert "the job's model (0M parameters) needs about" in log, log[-2000:]
    assert "0 MiB is free (--max-memory, less 512 MiB kept free)" in log, log[-2000:]
    assert "Traceback" not in log


def test_a_gpu_context_is_sized_to_the_gpu():
    shape = model_shape(SMOLLM2)
    h200, gaming, tiny = 139 * 2**30, 8 * 2**30, 2**30
    assert gpu_cells(shape, LLAMA, "f16", h200) == LLAMA.gpu_cells  # 256 sequences of 256 tokens
    cells = gpu_cells(shape, LLAMA, "f16", gaming)
    assert LLAMA_CELLS < cells < LLAMA.gpu_cells and cells % 256 == 0
    # The most cells (in steps of 256) within a quarter of what is left beside two versions' weights.
    quarter = (gaming - 2 * 2 * shape.parameters) / 4
    assert cells * LLAMA.cell_bytes(shape) <= quarter < (cells + 256) * LLAMA.cell_bytes(shape)
    assert gpu_cells(shape, LLAMA, "f16", tiny) == LLAMA_CELLS  # never fewer than on the CPU
    assert gpu_cells(shape, TORCH, "bf16", h200) == 0  # torch's cache is each call's own


def test_on_a_gpu_an_assignments_groups_decode_side_by_side(tmp_path):
    """4,096 cells held one group of 16 x 128 new tokens at a time: on a GPU,
    where a step costs about the same for 16 sequences as for 256, the node
    would have run at a sixteenth of its speed on 256 rows (issue 71)."""
    from echo_node.backend_llama import LlamaBackend
    from echo_node.backend_trial import random_llama
    from echo_node.device import Device
    from echo_node.memory import fit_backend

    if not LLAMA.installed():
        pytest.skip("llama.cpp not installed")
    free = 8 * 2**30
    # llama.cpp's CPU build runs the layers "offloaded" to this GPU on the CPU.
    gpu = Device("cuda", "a GPU in name", free, usage=lambda: (free, 0))
    backend = LlamaBackend("f16", threads=1, work_dir=tmp_path, device=gpu)
    config_json, weights = random_llama()
    fit_backend(backend, model_shape(config_json), free)
    assert backend.kv_cells == LLAMA.gpu_cells and backend.max_sequences == 256
    backend.load(config_json, weights)
    prompts = [(257, 97 + i, 98) for i in range(4)]
    groups = backend.generate(prompts, 16, 128, 1.0, ())
    assert [len(s.tokens) for g in groups for s in g] == [128] * 64
    assert backend.timing.steps <= 130, backend.timing  # all four groups at once (one at a time: 512 steps)
    backend.close()
