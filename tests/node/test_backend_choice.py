"""``--backend auto|torch|llama``: what is chosen, why, and what a user is told."""

import dataclasses

import pytest

from echo_node import backend_choice, backend_llama, backend_torch
from echo_node.backend_choice import BackendUnavailable, choose, llama_installed


def without_llama(monkeypatch):
    """As on a machine without the ``llama`` extra."""
    missing = dataclasses.replace(backend_llama.SPEC, installed=lambda: False)
    monkeypatch.setattr(backend_choice, "specs", lambda: iter((missing, backend_torch.SPEC)))


def test_auto_falls_back_to_torch_and_says_why(monkeypatch, tmp_path):
    without_llama(monkeypatch)
    chosen, why = choose("auto", "f32", 1, tmp_path)
    assert chosen.name == "torch" and "not installed" in why and "[llama]" in why


def test_asking_for_llama_without_it_explains_how_to_install(monkeypatch, tmp_path):
    without_llama(monkeypatch)
    with pytest.raises(BackendUnavailable, match=r"pip install .*\[llama\]"):
        choose("llama", "f32", 1, tmp_path)


def test_torch_runs_f32_on_the_cpu_and_no_quantised_dtype(tmp_path):
    with pytest.raises(BackendUnavailable, match="f32, bf16 or f16, not q8_0"):
        choose("torch", "q8_0", 1, tmp_path)
    chosen, _ = choose("torch", "auto", 1, tmp_path, "cpu")
    assert (chosen.dtype, chosen.device.kind) == ("f32", "cpu")
    chosen, _ = choose("torch", "bf16", 1, tmp_path, "cpu")  # asked for: slower here, but allowed for
    assert chosen.dtype == "bf16"


@pytest.mark.skipif(not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]'")
def test_auto_prefers_llama_when_installed(tmp_path):
    chosen, why = choose("auto", "q8_0", 1, tmp_path)
    assert (chosen.name, chosen.dtype) == ("llama", "q8_0") and "installed" in why


# --- --device and --threads -------------------------------------------------------


def test_auto_takes_the_best_device_that_works_here(tmp_path):
    """On a machine without a GPU (CI) auto runs on the CPU and says why; on
    one with CUDA torch takes it."""
    import torch

    chosen, why = choose("torch", "f32", 1, tmp_path, "auto")
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert chosen.device.kind == expected
    assert ("no GPU torch can use" in why) == (expected == "cpu"), why
    assert chosen.device.memory > 0  # free RAM (or VRAM): what memory checks compare against


@pytest.mark.parametrize("backend_name", ["torch", "llama"])
@pytest.mark.parametrize("kind", ["cuda", "mps", "vulkan"])
def test_asking_for_a_missing_gpu_says_what_to_install(backend_name, kind, tmp_path):
    from echo_node.backend_choice import choose_device, spec_of
    from echo_node.device import DeviceUnavailable

    if backend_name == "llama" and not llama_installed():
        pytest.skip("llama.cpp not installed")
    spec = spec_of(backend_name)
    if kind in spec.gpu_kinds():
        pytest.skip(f"this machine has {kind} for {backend_name}")
    with pytest.raises(DeviceUnavailable, match="README|Vulkan|offloads to") as refused:
        choose_device(kind, spec)
    assert f"--device {kind}" in str(refused.value)


def test_cpu_threads_default_to_physical_cores_minus_one(tmp_path):
    import psutil

    from echo_node.device import default_threads

    cores = psutil.cpu_count(logical=False) or 1
    assert default_threads() == max(1, cores - 1)
    chosen, why = choose("torch", "f32", 0, tmp_path, "cpu")  # 0: the default
    assert f"CPU threads: {default_threads()}" in why
    import torch

    assert torch.get_num_threads() == default_threads()
    choose("torch", "f32", 3, tmp_path, "cpu")
    assert torch.get_num_threads() == 3
