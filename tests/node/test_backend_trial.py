"""A node on a GPU tries its backend on a tiny model in a child process before
it joins (``echo_node.backend_trial``): a crash there is one line and a
non-zero exit, never a silent death; and a llama.cpp node never imports torch
(torch's CUDA beside llama.cpp's crashed its model load on an H200, issue 71).

Without a GPU here, tests/fake_gpu/ claims one for llama.cpp in the processes
the tests start (the CPU build runs the "offloaded" layers on the CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from echo_node import status
from echo_node.backend_choice import llama_installed
from echo_node.backend_trial import try_backend

FAKE_GPU = str(Path(__file__).resolve().parent.parent / "fake_gpu")
NOWHERE = "/ip4/127.0.0.1/tcp/9/p2p/QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"  # nothing listens there

needs_llama = pytest.mark.skipif(not llama_installed(), reason="llama.cpp not installed (make test installs it)")


def fake_gpu_env(**more: str) -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join([FAKE_GPU, os.environ.get("PYTHONPATH", "")]),
        "ECHO_FAKE_GPU": "cuda",
        **more,
    }


@needs_llama
@pytest.mark.parametrize("backend, dtype", [("llama", "q8_0"), ("torch", "f32")])
def test_a_backend_that_works_passes_its_trial(backend, dtype):
    trial = try_backend(backend, dtype, "cpu")
    assert trial.ok and "16 tokens" in trial.detail and not trial.instead, trial


@needs_llama
def test_a_crash_in_the_trial_is_a_finding_with_the_backends_last_words(monkeypatch):
    for name, value in fake_gpu_env(ECHO_FAKE_GPU_CRASH="1").items():
        monkeypatch.setenv(name, value)
    trial = try_backend("llama", "f16", "cuda")
    assert not trial.ok
    assert "llama.cpp crashed (SIGSEGV)" in trial.line and "the fake GPU refused" in trial.line, trial
    assert trial.instead == "--backend torch or --device cpu"


@needs_llama
def test_a_node_whose_gpu_backend_crashes_says_so_in_one_line_and_exits(tmp_path):
    join = [sys.executable, "-m", "echo_node", "join", "--bootstrap", NOWHERE, "--data-dir", str(tmp_path)]
    done = subprocess.run(
        [*join, "--backend", "llama", "--device", "cuda"],
        env={**os.environ, **fake_gpu_env(ECHO_FAKE_GPU_CRASH="1")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("echo-node: error: llama.cpp crashed (SIGSEGV)"), line
    assert "'ggml_fake_init: the fake GPU refused (tests/fake_gpu)'; try --backend torch or --device cpu" in line


@needs_llama
def test_the_doctor_reports_a_gpu_backend_that_crashes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "echo_node", "doctor", "--json", "--bootstrap", NOWHERE, "--data-dir", str(tmp_path)]
        + ["--backend", "llama", "--device", "cuda", "--bootstrap-timeout-s", "2"],
        env={**os.environ, **fake_gpu_env(ECHO_FAKE_GPU_CRASH="1")},
        capture_output=True,
        text=True,
        timeout=180,
    )
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == 1 and checks["backends"]["status"] == "ok", done.stdout
    assert checks["gpu"]["status"] == "fail" and "crashed (SIGSEGV)" in checks["gpu"]["detail"], checks["gpu"]
    assert checks["gpu"]["fix"] == "try --backend torch or --device cpu"


@needs_llama
@pytest.mark.procs  # a bootstrap peer, a learner and a node
def test_a_llama_node_on_a_gpu_never_imports_torch(swarm_factory):
    swarm = swarm_factory
    swarm.start_bootstrap()
    swarm.start_learner("--steps", "1000", "--mode", "async")
    swarm.start_node(0, "--backend", "llama", "--device", "cuda", env=fake_gpu_env(ECHO_FORBID_TORCH="1"))

    def accepted() -> int:
        try:
            return status.read(swarm.root / "node0" / "status.json").get("batches_accepted", 0)
        except status.NotRunning:
            return 0

    swarm.wait_until(lambda: accepted() >= 2, 180, "the node's first batches")
    log = (swarm.root / "node0.log").read_text()
    assert "gpu: llama.cpp loaded and decoded a tiny model on Fake cuda GPU" in log, log[-3000:]
    assert "FORBIDDEN" not in log, log[-3000:]
