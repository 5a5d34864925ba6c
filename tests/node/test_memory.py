"""A node sizes its work to its memory: estimates above what generation
really allocates, a smaller dtype or fewer prompts per call when that fits,
one clear line when nothing does."""

import json
import os
import subprocess
import sys

import pytest

from echo_node.backend_choice import spec_of
from echo_node.backend_llama import LLAMA_CELLS
from echo_node.memory import (
    call_need,
    choose_dtype,
    gpu_layers,
    load_need,
    prompts_per_call,
)
from echo_node.model_shape import model_shape
from echo_node.refusals import Refused

LLAMA, TORCH = spec_of("llama"), spec_of("torch")

# SmolLM2-135M-Instruct's shape (its GGUF's config), without loading it.
SMOLLM2 = json.dumps(
    {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    }
)

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

prompts, group, new, vocab = (int(a) for a in sys.argv[1:5])
config = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=256, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                     tie_word_embeddings=True)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
config_json = json.dumps(model.config.to_dict())
backend = TorchBackend(threads=1)
backend.load(config_json, save({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}))
del model
backend.generate([(1, 2, 3)] * prompts, group, 4, 1.0, ())  # allocator and kernels warmed up
before = psutil.Process().memory_info().rss
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS (VmHWM) starts again from now: loading's peak is not the call's
backend.generate([tuple(range(1, 17))] * prompts, group, new, 1.0, ())  # no stop token: every token generated
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024
need = call_need(model_shape(config_json), spec_of("torch"), prompts * group, 16, new)
print(json.dumps({"grew": peak - before, "estimate": need.total, "cache": need.cache, "buffers": need.buffers}))
"""


# One call dominated by its logits (a large vocabulary), one by its KV cache
# (long generations).
@pytest.mark.heavy  # ~15 s each: a real generation's peak memory, measured in a process of its own
@pytest.mark.parametrize("prompts, group, new, vocab", [(8, 8, 48, 65536), (4, 8, 480, 4096)])
def test_the_estimate_holds_what_torch_generation_really_allocates(prompts, group, new, vocab):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, (prompts, group, new, vocab))],
        # Large tensors in their own mappings, returned when freed: with
        # glibc's sliding threshold the same call's peak RSS growth read
        # 77-194 MB run to run, a figure of the heap's history, not the call.
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    print(seen)
    assert seen["grew"] > 100 * 2**20  # the call allocates enough to measure
    assert seen["grew"] <= seen["estimate"] <= 3 * seen["grew"], seen  # above, and not absurdly


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
