"""A LoRA run's q8_0 base in a real swarm: the learner publishes the base
(bf16) and its signed q8_0 GGUF; a llama.cpp q8_0 node fetches the GGUF in
place of the base and the adapters on top, an f32 node fetches the base, and
every batch both send is accepted. Neither node is handed the other's file
(a chunk of the wrong one would fail its hash and get an honest peer banned).

The adapters are non-zero from the first version (``--lora-init-scale``: the
random model scores 0 on every prompt, so training alone would leave them
zero): a third q8_0 node that loads each adapter but never sets it (the
project's node with that one change, bench/cheats.py) generates from the base
alone, and is refused."""

from pathlib import Path

import pytest
import torch

from echo_learner.ledger import Ledger
from echo_learner.verify.evidence import PRECISION_MISMATCH
from echo_learner.verify.verifier import BAD_LOGPROBS
from echo_node.backend_choice import llama_installed
from protocol import codec
from protocol.identity import load_or_create
from protocol.messages import Manifest
from protocol.models import updates
from tests.families import save_tiny_model
from tests.test_crash import wait_until
from tests.test_real_model import accepted_by_peer, refusals

pytestmark = pytest.mark.skipif(
    not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)"
)

STEPS = 3
CHEATS = str(Path(__file__).resolve().parent.parent / "bench" / "cheats.py")


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
        "--max-new-tokens", "8", "--torch-threads", "1", "--lora-init-scale", "0.01",
    )  # fmt: skip
    swarm.start_node(0, "--backend", "llama", "--dtype", "q8_0", "--threads", "1")
    swarm.start_node(1, "--backend", "llama", "--dtype", "f32", "--threads", "1")
    swarm.start_node(
        2, "--backend", "llama", "--dtype", "q8_0", "--threads", "1", program=(CHEATS, "adapter_dropped", "--")
    )
    ledger = swarm.root / "learner" / "ledger.sqlite"
    honest = {load_or_create(swarm.root / f"node{i}" / "identity.key").peer_id_str for i in (0, 1)}
    dropped = load_or_create(swarm.root / "node2" / "identity.key").peer_id_str

    def dtypes():
        return {
            batch.dtype for peer, batches in accepted_by_peer(ledger).items() if peer in honest for batch in batches
        }

    wait_until(
        lambda: len(swarm.metrics()) >= STEPS and dtypes() == {"q8_0", "f32"} and refusals(ledger),
        300,
        f"{STEPS} steps, batches accepted from the q8_0 and the f32 node, the adapter-less node refused",
        learner,
        swarm.root / "learner.log",
    )
    refused = refusals(ledger)
    assert {peer for peer, _, _ in refused} == {dropped}, (refused, dropped)
    assert refused[0][2] in (BAD_LOGPROBS, PRECISION_MISMATCH)
    # Caught within a few of its (32-token) batches, and whatever they earned is forfeited.
    assert len(accepted_by_peer(ledger).get(dropped, [])) <= 8
    [standing] = [s for s in Ledger(ledger, readonly=True).leaderboard() if s.peer == dropped]
    assert standing.credit == 0
    codes = {name: swarm.stop(name) for name in ("node0", "node1", "node2", "learner")}
    assert set(codes.values()) == {0}, codes

    published = base_manifest(swarm.root / "learner")
    [variant_path] = (swarm.root / "learner").glob("weights/*/variants/manifests/0.msgpack")
    variant = codec.decode(variant_path.read_bytes(), Manifest)
    assert (published.format, variant.format) == (updates.FULL, updates.Q8_GGUF)
    assert variant.base_digest == codec.digest(published) and variant.total_size < 0.6 * published.total_size
    # Each node holds the base in the form its backend runs.
    assert base_manifest(swarm.root / "node0") == variant
    assert base_manifest(swarm.root / "node1") == published
    for name in ("node0", "node1"):  # the dropped adapter's node was banned, as it should be
        log = (swarm.root / f"{name}.log").read_text()
        assert "failed its hash" not in log and "banned" not in log, name
