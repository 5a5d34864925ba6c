"""A LoRA job end to end, real processes: the learner publishes the frozen base
once and then adapters; a torch node and a llama.cpp node both rebuild and
roll out with them; kill -9 and --resume keep the adapter and its optimiser;
export writes the adapter and the merged model."""

import signal
import subprocess
import sys
import time

import pytest
import torch

from protocol import codec
from protocol.messages import Manifest
from tests.test_crash import cli, free_port, node_receipts, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(__import__("importlib").util.find_spec(m) for m in ("llama_cpp", "gguf", "peft")),
        reason="needs llama.cpp and peft: make install-llama",
    ),
]

LORA = ("--lora", "8", "--lr", "3e-3")


def manifests(swarm):
    root = swarm.root / "learner" / "weights"
    return {m.version: m for m in (codec.decode(p.read_bytes(), Manifest) for p in root.glob("*/manifests/*"))}


def accepted_after(swarm, i, version):
    return any(r.version > version and r.verdict == "accepted" for r in node_receipts(swarm, i))


def test_lora_job_with_both_backends_survives_kill_and_resume(swarm_factory, tmp_path):
    swarm = swarm_factory
    swarm.start_bootstrap()
    port = free_port()
    data_dir = str(swarm.root / "learner")
    args = ("--steps", "100000", "--checkpoint-every", "3", *LORA)

    def start_learner(*extra):
        return swarm._spawn(
            "learner",
            [
                "echo_learner",
                "run",
                "--bootstrap",
                swarm.bootstrap_addr,
                "--listen",
                f"/ip4/127.0.0.1/tcp/{port}",
                "--data-dir",
                data_dir,
                *args,
                *extra,
            ],
        )

    learner = start_learner()
    swarm.start_node(0, "--backend", "torch")
    swarm.start_node(1, "--backend", "llama")
    log = swarm.root / "learner.log"
    wait_until(
        lambda: len(swarm.metrics()) >= 7 and all(accepted_after(swarm, i, 1) for i in range(2)),
        300,
        "LoRA steps with both nodes",
        learner,
        log,
    )

    published = manifests(swarm)
    assert published[0].format == "safetensors" and published[0].base_version == -1
    newest = max(published)
    assert published[newest].format == "lora" and published[newest].base_version == 0
    assert published[newest].total_size < 0.5 * published[0].total_size

    # --- kill -9, then resume ---------------------------------------------------------
    learner.send_signal(signal.SIGKILL)
    learner.wait()
    steps_before = swarm.metrics()
    killed_at_version = steps_before[-1]["version"]
    checkpoint = torch.load(swarm.root / "learner" / "checkpoint.pt", weights_only=True)
    assert checkpoint["lora"]["rank"] == 8 and all("lora_" in k for k in checkpoint["model"])
    assert checkpoint["optimizer"]["state"]  # AdamW moments of the adapter

    # Resuming with other LoRA settings is refused, with what the checkpoint holds.
    wrong = subprocess.run(
        [
            sys.executable,
            "-m",
            "echo_learner",
            "run",
            "--data-dir",
            data_dir,
            "--resume",
            "--lora",
            "4",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wrong.returncode != 0 and "LoRA rank 8" in wrong.stderr, wrong.stderr[-2000:]

    restarted = time.monotonic()
    learner = start_learner("--resume")
    wait_until(
        lambda: all(accepted_after(swarm, i, killed_at_version) for i in range(2)),
        300,
        "both nodes to work for the restarted learner",
        learner,
        log,
    )
    wait_until(lambda: len(swarm.metrics()) >= len(steps_before) + 3, 300, "steps after resume", learner, log)
    after = swarm.metrics()[len(steps_before) :]
    assert after[0]["step"] == checkpoint["step"] and after[0]["version"] > killed_at_version
    # The restarted learner kept serving the same base: updates only.
    resumed = [m for v, m in manifests(swarm).items() if v > killed_at_version]
    assert resumed and all(m.format == "lora" and m.base_version == 0 for m in resumed)
    print(f"resumed in {time.monotonic() - restarted:.1f} s")

    codes = swarm.stop_all()
    assert set(codes.values()) == {0}, codes

    out = tmp_path / "exported"
    cli("-m", "echo_learner", "export", str(out), "--data-dir", data_dir)
    assert (out / "adapter" / "adapter_model.safetensors").exists()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in k for k in merged.state_dict())
