"""The learner's emulation of a declared backend and dtype is as far from its
f32 recompute as the real backend is, on the same tokens, and a cheaper
quantisation than declared is several times farther.

Real parts: the built-in model, llama.cpp (its own f16 and q8_0, and Q4_0
through llama.cpp's quantizer, as bench/cheats.py runs it), the torch
backend in bf16, the learner's recompute.
"""

import random
from pathlib import Path

import pytest

from echo_learner.training.lora import state_bytes
from echo_learner.training.model import config_json
from echo_learner.verify.emulate import can_emulate, emulated
from echo_learner.verify.evidence import PRECISION_MISMATCH, BatchEvidence, EvidenceBook, EvidenceLimits
from echo_learner.verify.recompute import logprob_error
from echo_node.backend_choice import choose, llama_installed
from tests.learner.test_logprob_check import versions

PAD, EOS = 256, 258


def distance_ratio(model, backend, declared, batches=3, seed=0):
    """Sum over ``batches`` of |reported - f32| over sum of |emulated - f32|."""
    from plausibility import as_batch, prompts_for  # bench/plausibility.py

    twin = emulated(model, *declared)
    rng = random.Random(seed)
    reported = emulation = 0.0
    for _ in range(batches):
        prompts = prompts_for(rng)
        groups = backend.generate(prompts, 8, 16, 1.0, (EOS,))
        batch = as_batch(*declared, [[(s.tokens, tuple(s.logprobs)) for s in g] for g in groups])
        evidence = logprob_error(model, prompts, batch, PAD, emulation=twin).evidence
        reported += evidence.reported_off
        emulation += evidence.emulated_off
    return reported / emulation


def sharp():
    return list(versions(3))[2]


@pytest.mark.skipif(not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)")
@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_llama_cpp_is_as_far_off_as_its_emulation(dtype, tmp_path):
    model = sharp()
    backend, _ = choose("llama", dtype, 1, tmp_path, "cpu")
    backend.load(config_json(model), state_bytes(model))
    ratio = distance_ratio(model, backend, ("llama", dtype))
    print(f"llama.cpp {dtype}: {ratio:.3f} x the emulation's distance")
    assert 0.8 < ratio < 1.25


@pytest.mark.skipif(not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)")
def test_q4_0_declaring_q8_0_is_several_times_farther_and_caught(tmp_path, monkeypatch):
    from cheats import FTYPES, cheaper_gguf  # bench/cheats.py: the cheating node's one change

    from echo_node import backend_llama

    for name in ("write_gguf", "write_atomic"):  # undone after the test, whatever the cheat sets
        monkeypatch.setattr(backend_llama, name, getattr(backend_llama, name))
    cheaper_gguf(FTYPES["q4_0"])()
    model = sharp()
    backend, _ = choose("llama", "q8_0", 1, tmp_path, "cpu")
    backend.load(config_json(model), state_bytes(model))
    ratio = distance_ratio(model, backend, ("llama", "q8_0"), batches=2)
    print(f"Q4_0 declaring q8_0: {ratio:.2f} x the emulation's distance")
    assert ratio > 3
    # A 300-token batch that far off is past the precision test's limit at once.
    book = EvidenceBook(EvidenceLimits(), max_peers=1)
    evidence = BatchEvidence(tokens=300, reported_off=ratio * 9, emulated_off=9)
    assert book.add("p", ("llama", "q8_0", "cpu"), evidence) == PRECISION_MISMATCH


def test_torch_bf16_is_as_far_off_as_its_emulation():
    model = sharp()
    backend, _ = choose("torch", "bf16", 1, Path("."), "cpu")
    backend.load(config_json(model), state_bytes(model))
    ratio = distance_ratio(model, backend, ("torch", "bf16"))
    print(f"torch bf16: {ratio:.3f} x the emulation's distance")
    assert 0.8 < ratio < 1.25


def test_only_the_cpus_arithmetic_is_emulated():
    assert can_emulate("llama", "q8_0", "cpu") and can_emulate("torch", "bf16", "cpu")
    assert not can_emulate("llama", "f32", "cpu")  # the recompute itself
    assert not can_emulate("llama", "q8_0", "cuda")  # GPU kernels: not measured yet
