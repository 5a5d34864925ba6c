"""The q8_0 variant of a LoRA base (protocol/models/updates.py): the learner's GGUF
is deterministic, is what a q8_0 node would export itself, rebuilds bit-exact
from its chunks, is refused when tampered, and takes the run's adapters in
llama.cpp like the base it stands for."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from echo_learner.swarm.publishing import JobManifestFields, Publisher
from echo_learner.training.lora import LoraSettings, adapter_bytes, state_bytes, wrap
from echo_learner.training.model import config_json
from echo_learner.verify.tolerance import tolerance
from protocol import codec, manifest
from protocol.broadcast.store import VersionStore
from protocol.errors import ChunkHashMismatch, DecodeError
from protocol.identity import Identity
from protocol.messages import UNSIGNED
from protocol.models import updates
from protocol.models.gguf_export import f32_tensors, write_gguf
from protocol.models.updates import Q8_GGUF, UpdateRefused
from tests.families import randomize_adapter, tiny_model
from tests.node.test_families import differences, llama_backend, needs_llama
from tests.protocol.samples import LEARNER

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SETTINGS = LoraSettings(rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
FAMILY = "qwen3"  # q/k norms and no q/k permutation: the exporter's other path than llama's


def lora_publisher(base: torch.nn.Module) -> Publisher:
    return Publisher(
        LEARNER,
        JobManifestFields(
            job_id="job",
            task="reverse",
            model_config=config_json(base),
            tokenizer_digest=b"t" * 32,
            chunk_size=16 * 1024,
        ),
        max_update_ratio=0.9,
        lora=SETTINGS,
        frozen_base=state_bytes(base),
        q8_base=True,
    )


@pytest.fixture
def published(tmp_path):
    """A bf16 base (v0), its q8_0 variant and one LoRA version (v1)."""
    base = tiny_model(FAMILY, dtype=torch.bfloat16)
    publisher = lora_publisher(base)
    base_manifest, _ = publisher.build_base(0)
    [(variant, chunks)] = publisher.build_variants(base_manifest, tmp_path)
    # The learner trains in f32 on the base as published (bf16 values).
    policy = wrap(copy.deepcopy(base).float(), SETTINGS)
    randomize_adapter(policy, 0.3, seed=1)
    update, update_chunks = publisher.build(1, policy)
    return dict(
        base=base,
        policy=policy,
        publisher=publisher,
        base_manifest=base_manifest,
        variant=variant,
        chunks=chunks,
        update=update,
        update_chunks=update_chunks,
    )


def hold(store: VersionStore, m, chunks) -> None:
    store.add_manifest(m)
    for idx, data in enumerate(chunks):
        store.write(m.version, idx, data)


def test_the_variant_is_signed_deterministic_and_what_a_node_would_export(published, tmp_path):
    variant, base_manifest = published["variant"], published["base_manifest"]
    manifest.check(variant, LEARNER.peer_id_str)
    assert (variant.format, variant.version, variant.base_version) == (Q8_GGUF, 0, 0)
    assert variant.base_digest == codec.digest(base_manifest)
    # Built again (a restarted learner, anyone checking): the same bytes.
    [(again, _)] = published["publisher"].build_variants(base_manifest, tmp_path)
    assert (again.weights_digest, again.chunk_hashes) == (variant.weights_digest, variant.chunk_hashes)
    # The very file a q8_0 node exported itself from the base before.
    mine = tmp_path / "node.gguf"
    write_gguf(base_manifest.model_config, f32_tensors(state_bytes(published["base"])), mine, "q8_0")
    assert updates.digest(mine.read_bytes()) == variant.weights_digest
    # None when it is turned off (--no-q8-base).
    published["publisher"].q8_base = False
    assert published["publisher"].build_variants(base_manifest, tmp_path) == []


def test_a_variant_rebuilds_bit_exact_from_its_chunks_and_tampering_is_refused(published, tmp_path):
    variant, chunks = published["variant"], published["chunks"]
    store = VersionStore(tmp_path / "store", learner_id=LEARNER.peer_id_str, keep=3)
    store.add_manifest(variant)
    bad = bytearray(chunks[1])
    bad[100] ^= 1
    with pytest.raises(ChunkHashMismatch):
        store.write(0, 1, bytes(bad))
    assert 1 not in store.chunks_held(0)
    for idx, data in enumerate(chunks):
        store.write(0, idx, data)
    assert updates.digest(store.assemble(0)) == variant.weights_digest
    store.check_signed(0)
    assert store.usable(0)
    # A variant that names another version, or is signed by anyone else, is refused.
    other = Identity.generate()
    renamed = LEARNER.sign(dataclasses.replace(variant, base_version=1, version=2, signature=UNSIGNED))
    with pytest.raises(DecodeError):
        manifest.check(renamed, LEARNER.peer_id_str)
    with pytest.raises(DecodeError):
        manifest.check(other.sign(dataclasses.replace(variant, learner_id=other.peer_id_str)), LEARNER.peer_id_str)


def test_adapters_apply_to_the_variant_and_deltas_do_not(published, tmp_path):
    variant, update = published["variant"], published["update"]
    store = VersionStore(tmp_path / "store", learner_id=LEARNER.peer_id_str, keep=3)
    hold(store, variant, published["chunks"])
    hold(store, update, published["update_chunks"])
    assert store.base_of(1) == variant and store.usable(1)
    store.check_signed(1)
    # Merging is for full bases: a variant base loads its adapters in llama.cpp.
    with pytest.raises(UpdateRefused):
        store.rebuild(1)
    delta = dataclasses.replace(update, format=updates.DELTA)
    with pytest.raises(UpdateRefused):
        updates.check_base(delta, variant)
    # A variant of another base does not stand in for this one.
    with pytest.raises(UpdateRefused):
        updates.check_base(update, dataclasses.replace(variant, base_digest=b"x" * 32))


@needs_llama
def test_a_q8_node_runs_the_variant_and_its_adapters_as_it_would_its_own_export(published, tmp_path):
    config = published["base_manifest"].model_config
    gguf = b"".join(published["chunks"])
    adapter = adapter_bytes(published["policy"], SETTINGS)
    base_weights = state_bytes(published["base"])
    exported = llama_backend(tmp_path / "exported", "q8_0")
    assert exported.variant == Q8_GGUF
    exported.use(exported.prepare_lora(config, b"base", lambda: base_weights, adapter))
    fetched = llama_backend(tmp_path / "fetched", "q8_0")
    fetched.use(fetched.prepare_lora(config, b"variant", lambda: gguf, adapter, Q8_GGUF))
    policy = published["policy"].eval()
    allowed = tolerance("llama", "q8_0", family=FAMILY)
    for name, backend in (("exported", exported), ("fetched", fetched)):
        worst, mean, tokens, _ = differences(policy, backend, seed=3)
        # The adapter is there: the base alone is several times farther off
        # than the q8_0 rounding (a node that dropped it would be refused).
        _, base_mean, _, _ = differences(published["base"].float().eval(), backend, seed=3)
        print(f"LoRA on the {name} q8_0 base: {tokens} tokens, worst {worst:.2e} mean {mean:.2e}; base {base_mean:.2e}")
        assert tokens > 200 and worst < allowed.worst and mean < allowed.mean
        assert base_mean > 4 * mean
        backend.close()
    # A node of another dtype takes no q8_0 file.
    f32 = llama_backend(tmp_path / "f32", "f32")
    assert f32.variant == ""
    with pytest.raises(ValueError):
        f32.prepare(config, gguf, variant=Q8_GGUF)
