"""A LoRA run's q8_0 base in a real swarm: the learner publishes the base
(bf16) and its signed q8_0 GGUF; a llama.cpp q8_0 node fetches the GGUF in
place of the base and the adapters on top, an f32 node fetches the base, and
every batch both send is accepted. Neither node is handed the other's file
(a chunk of the wrong one would fail its hash and get an honest peer banned)."""

from pathlib import Path

import pytest
import torch

from echo_node.backend_choice import llama_installed
from protocol import codec
from protocol.messages import Manifest
from protocol.models import updates
from tests.families import save_tiny_model
from tests.test_crash import wait_until
from tests.test_real_model import accepted_by_peer, refusals

pytestmark = pytest.mark.skipif(
    not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)"
)

STEPS = 3


def base_manifest(data_dir: Path) -> Manifest:
    """The version-0 manifest a process holds (its job's only weights folder)."""
    [path] = data_dir.glob("weights/*/manifests/0.msgpack")
    return codec.decode(path.read_bytes(), Manifest)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_q8_node_fetches_the_q8_base_and_an_f32_node_the_base(swarm_factory, tmp_path):
    swarm = swarm_factory
    model_dir = save_tiny_model("qwen3", tmp_path / "qwen3", dtype=torch.bfloat16)
    swarm.start_bootstrap()
    learner = swarm.start_learner(
        "--model", str(model_dir), "--lora", "4", "--lr", "3e-3", "--group-size", "4", "--prompts-per-step", "4",
        "--max-new-tokens", "8", "--torch-threads", "1",
    )  # fmt: skip
    swarm.start_node(0, "--backend", "llama", "--dtype", "q8_0", "--threads", "1")
    swarm.start_node(1, "--backend", "llama", "--dtype", "f32", "--threads", "1")
    ledger = swarm.root / "learner" / "ledger.sqlite"

    def dtypes():
        return {batch.dtype for batches in accepted_by_peer(ledger).values() for batch in batches}

    wait_until(
        lambda: len(swarm.metrics()) >= STEPS and dtypes() == {"q8_0", "f32"},
        300,
        f"{STEPS} steps and batches accepted from the q8_0 and the f32 node",
        learner,
        swarm.root / "learner.log",
    )
    assert refusals(ledger) == []
    codes = {name: swarm.stop(name) for name in ("node0", "node1", "learner")}
    assert set(codes.values()) == {0}, codes

    published = base_manifest(swarm.root / "learner")
    [variant_path] = (swarm.root / "learner").glob("weights/*/variants/manifests/0.msgpack")
    variant = codec.decode(variant_path.read_bytes(), Manifest)
    assert (published.format, variant.format) == (updates.FULL, updates.Q8_GGUF)
    assert variant.base_digest == codec.digest(published) and variant.total_size < 0.6 * published.total_size
    # Each node holds the base in the form its backend runs.
    assert base_manifest(swarm.root / "node0") == variant
    assert base_manifest(swarm.root / "node1") == published
    for name in ("node0", "node1"):
        log = (swarm.root / f"{name}.log").read_text()
        assert "failed its hash" not in log and "banned" not in log, name
