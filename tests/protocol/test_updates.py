"""Versions as updates against a base: deltas and LoRA adapters rebuild bit-exact
or are refused, and the store keeps the bases its versions need."""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_learner.lora import LoraSettings, adapter_bytes, state_bytes, wrap
from echo_learner.model import ModelShape, build_model, config_json
from echo_learner.publishing import Publisher
from protocol import codec, manifest, updates
from protocol.broadcast.store import VersionStore
from protocol.errors import DecodeError
from protocol.updates import UpdateRefused

from .samples import LEARNER

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def publisher(lora=None, base=None, ratio=0.9):
    return Publisher(
        LEARNER,
        job_id="job",
        task="reverse",
        model_config="{}",
        tokenizer_digest=b"t" * 32,
        chunk_size=64 * 1024,
        max_update_ratio=ratio,
        lora=lora,
        frozen_base=base,
    )


def nudge(model, scale=1e-4, seed=0):
    """What one small optimiser step does: every weight moves a little."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g) * (p.abs() + 1e-3))


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=0, max_size=300), st.data())
def test_delta_rebuilds_any_file_exactly(base, data):
    new = data.draw(st.binary(min_size=len(base), max_size=len(base)))
    assert updates.decode_delta(base, updates.encode_delta(base, new)) == new


def test_delta_of_other_length_is_none_and_foreign_bytes_refused():
    assert updates.encode_delta(b"abcd", b"abcde") is None
    delta = updates.encode_delta(b"abcd" * 100, b"abce" * 100)
    with pytest.raises(UpdateRefused):
        updates.decode_delta(b"abcd" * 99, delta)  # other length
    with pytest.raises(UpdateRefused):
        updates.decode_delta(b"abcd" * 100, b"not zstd at all")


def test_full_weight_delta_version_rebuilds_bit_exact_and_is_small():
    model = build_model(ModelShape())
    pub = publisher()
    base, _ = pub.build(0, model)
    base_file = state_bytes(model)
    nudge(model)
    update, chunks = pub.build(1, model)
    assert (base.format, update.format, update.base_version) == ("safetensors", "delta", 0)
    assert update.base_digest == codec.digest(base)
    manifest.check(update, LEARNER.peer_id_str)
    rebuilt = updates.rebuild(update, b"".join(chunks), base, base_file)
    assert rebuilt == state_bytes(model)
    assert update.total_size < 0.75 * len(base_file)


def test_dense_fallback_publishes_full_weights_and_a_new_base():
    model = build_model(ModelShape())
    pub = publisher(ratio=0.3)
    pub.build(0, model)
    nudge(model, scale=0.5)  # far from the base: every bit differs
    m, _ = pub.build(1, model)
    assert m.format == "safetensors" and m.base_version == -1
    assert pub.base[0] is m


def test_update_against_a_wrong_base_or_tampered_is_refused():
    model = build_model(ModelShape())
    pub = publisher()
    base, base_chunks = pub.build(0, model)
    base_file = b"".join(base_chunks)
    nudge(model)
    update, chunks = pub.build(1, model)
    payload = b"".join(chunks)
    other, other_chunks = manifest.build(
        LEARNER,
        job_id="job",
        version=0,
        parent_version=-1,
        task="reverse",
        model_config="{}",
        tokenizer_digest=b"t" * 32,
        weights=base_file[:-1] + b"\x01",
        chunk_size=64 * 1024,
    )
    with pytest.raises(UpdateRefused, match="not against"):
        updates.rebuild(update, payload, other, b"".join(other_chunks))
    with pytest.raises(UpdateRefused, match="needs its base"):
        updates.rebuild(update, payload, None, None)
    # A base file that is not what its manifest signs.
    with pytest.raises(UpdateRefused, match="base v0"):
        updates.rebuild(update, payload, base, base_file[:-1] + b"\x01")


def test_manifest_check_refuses_inconsistent_base_fields():
    model = build_model(ModelShape())
    pub = publisher()
    base, _ = pub.build(0, model)
    nudge(model)
    update, _ = pub.build(1, model)
    for bad in (
        dataclasses.replace(update, base_version=-1),
        dataclasses.replace(update, base_version=1),
        dataclasses.replace(base, base_version=0),
        dataclasses.replace(update, base_digest=b""),
    ):
        with pytest.raises(DecodeError):
            manifest.check(LEARNER.sign(bad), LEARNER.peer_id_str)
    with pytest.raises(DecodeError):
        codec.decode(codec.encode(dataclasses.replace(update, format="zip")), type(update))


def test_lora_version_is_the_adapter_and_merges_to_the_peft_model():
    model = build_model(ModelShape())
    frozen = state_bytes(model)
    lora = LoraSettings(rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    peft_model = wrap(model, lora)
    pub = publisher(lora, frozen)
    assert pub.needs_base()
    base, base_chunks = pub.build_base(0)
    nudge(peft_model, scale=1.0)  # B from zero to something
    m, chunks = pub.build(1, peft_model)
    payload = b"".join(chunks)
    assert m.format == "lora" and payload == adapter_bytes(peft_model, lora)
    assert m.weights_digest == updates.digest(payload)
    rebuilt = updates.rebuild(m, payload, base, b"".join(base_chunks))
    plain = build_model(ModelShape())
    from safetensors.torch import load

    plain.load_state_dict(load(rebuilt), strict=False)
    plain.tie_weights()
    ids = torch.tensor([[257, 1, 2, 3, 4, 5]])
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits
        got = plain(input_ids=ids).logits
    assert not torch.allclose(want, build_model(ModelShape())(input_ids=ids).logits, atol=1e-3)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    assert config_json(peft_model) == config_json(plain)


def test_store_keeps_the_base_of_kept_updates(tmp_path):
    model = build_model(ModelShape())
    pub = publisher()
    store = VersionStore(tmp_path, learner_id=LEARNER.peer_id_str, keep=2)
    for v in range(5):
        m, chunks = pub.build(v, model)
        store.add_manifest(m)
        for i, c in enumerate(chunks):
            store.write(v, i, c)
        nudge(model, seed=v)
    assert sorted(store.manifests) == [0, 3, 4]  # the two newest and their base
    assert all(store.usable(v) for v in (0, 3, 4))
    assert store.rebuild(4) == state_bytes(model_after(4))
    # Without its base an update is complete but not usable.
    reopened = VersionStore(tmp_path, learner_id=LEARNER.peer_id_str, keep=2)
    for path in (tmp_path / "chunks").iterdir():
        if path.name in {h.hex() for h in reopened.manifests[0].chunk_hashes}:
            path.unlink()
    reopened = VersionStore(tmp_path, learner_id=LEARNER.peer_id_str, keep=2)
    assert reopened.complete(4) and not reopened.usable(4)


def model_after(steps):
    model = build_model(ModelShape())
    for v in range(steps):
        nudge(model, seed=v)
    return model


def test_an_old_base_goes_once_no_kept_version_needs_it(tmp_path):
    model = build_model(ModelShape())
    pub = publisher(ratio=0.6)
    store = VersionStore(tmp_path, learner_id=LEARNER.peer_id_str, keep=2)
    formats = []
    for v in range(5):
        nudge(model, scale=0.5 if v == 3 else 1e-4, seed=v)  # v3 far from v0: a new base
        m, chunks = pub.build(v, model)
        formats.append(m.format)
        store.add_manifest(m)
        for i, c in enumerate(chunks):
            store.write(v, i, c)
    assert formats == ["safetensors", "delta", "delta", "safetensors", "delta"]
    assert sorted(store.manifests) == [3, 4]
    assert store.manifests[4].base_version == 3 and store.usable(4)
    on_disk = {p.name for p in (tmp_path / "chunks").iterdir()}
    assert on_disk == {h.hex() for v in (3, 4) for h in store.manifests[v].chunk_hashes}
