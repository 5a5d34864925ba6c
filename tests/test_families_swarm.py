"""Every model family in a real swarm: for each, a learner trains the tiny
random model of tests/families.py (``--model DIR``), a torch node and a
llama.cpp node generate, and every batch they send is verified and accepted.
Qwen3 goes in bf16 (its base travels in bf16), Gemma 2 with LoRA (adapters
in llama.cpp)."""

import time

import pytest
import torch

from echo_node.backend_choice import llama_installed
from tests.families import FAMILIES, save_tiny_model
from tests.test_crash import wait_until
from tests.test_real_model import accepted_by_peer, refusals

pytestmark = pytest.mark.skipif(
    not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)"
)

STEPS = 3
DTYPE = {"qwen3": torch.bfloat16}
EXTRA = {"gemma2": ("--lora", "4", "--lr", "3e-3")}


def run_family(swarm, family, tmp_path):
    model_dir = save_tiny_model(family, tmp_path / family, dtype=DTYPE.get(family, torch.float32))
    swarm.root = tmp_path / f"swarm-{family}"  # each job its own data dirs and logs
    swarm.root.mkdir()
    learner = swarm.start_learner(
        "--model", str(model_dir), "--group-size", "4", "--prompts-per-step", "4",
        "--max-new-tokens", "8", "--torch-threads", "1", *EXTRA.get(family, ()),
    )  # fmt: skip
    swarm.start_node(0, "--backend", "torch", "--threads", "1")
    swarm.start_node(1, "--backend", "llama", "--dtype", "f32", "--threads", "1")
    ledger = swarm.root / "learner" / "ledger.sqlite"

    def backends():
        return {batch.backend for batches in accepted_by_peer(ledger).values() for batch in batches}

    wait_until(
        lambda: len(swarm.metrics()) >= STEPS and backends() == {"torch", "llama"},
        240,
        f"{family}: {STEPS} steps and batches accepted from both backends",
        learner,
        swarm.root / "learner.log",
    )
    assert refusals(ledger) == []
    codes = {name: swarm.stop(name) for name in ("node0", "node1", "learner")}
    assert set(codes.values()) == {0}, codes
    for name in codes:
        del swarm.procs[name]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_family_trains_with_both_backends_and_no_refusal(swarm_factory, tmp_path):
    swarm = swarm_factory
    swarm.start_bootstrap()
    for family in FAMILIES:
        started = time.monotonic()
        run_family(swarm, family, tmp_path)
        print(f"{family}: {STEPS} steps, both nodes accepted, in {time.monotonic() - started:.0f} s")
