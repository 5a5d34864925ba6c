"""Versions as updates against a base: deltas and LoRA adapters rebuild bit-exact
or are refused, and the store keeps the bases its versions need. An update
that declares more than a node allows (a bomb from a learner key the node
trusts) is refused before anything is allocated for it."""

import dataclasses
import json
import tracemalloc

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_learner.swarm.publishing import JobManifestFields, Publisher
from echo_learner.training.lora import LoraSettings, adapter_bytes, state_bytes, wrap
from echo_learner.training.model import ModelShape, build_model, config_json
from protocol import codec, manifest
from protocol.broadcast.store import VersionStore
from protocol.errors import DecodeError
from protocol.models import updates
from protocol.models.updates import UpdateLimits, UpdateRefused

from .samples import LEARNER

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def publisher(lora=None, base=None, ratio=0.9):
    return Publisher(
        LEARNER,
        JobManifestFields(
            job_id="job", task="reverse", model_config="{}", tokenizer_digest=b"t" * 32, chunk_size=64 * 1024
        ),
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


# --- updates that declare more than a node allows -----------------------------------


def declaring(size, content):
    """An unfinished zstd frame whose header declares ``size`` bytes and whose
    blocks hold ``content``: what a hostile learner can sign as a delta."""
    writer = zstandard.ZstdCompressor(level=3).compressobj(size=size)
    return writer.compress(content) + writer.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)


def peak_bytes(fn, *args):
    tracemalloc.start()
    try:
        with pytest.raises(UpdateRefused) as refused:
            fn(*args)
        return tracemalloc.get_traced_memory()[1], str(refused.value)
    finally:
        tracemalloc.stop()


def test_a_delta_declaring_8_gib_is_refused_without_allocating():
    base = np.random.default_rng(0).bytes(2**20)
    bomb = declaring(8 * 2**30, np.random.default_rng(1).bytes(256 * 2**10))
    assert len(bomb) < 300 * 2**10 and zstandard.get_frame_parameters(bomb).content_size == 8 * 2**30
    peak, why = peak_bytes(updates.decode_delta, base, bomb)
    assert peak < 2**20, f"{peak / 2**20:.1f} MiB allocated for a refusal"
    assert "declares 8589934592 bytes" in why


def test_delta_frames_beyond_the_base_are_refused_by_a_bounded_reader():
    base = np.random.default_rng(2).bytes(64 * 2**10)
    good = updates.encode_delta(base, base[::-1])
    unknown = zstandard.ZstdCompressor(write_content_size=False)
    # Frames of unknown size rebuild like any other when they hold the base's length.
    planes = zstandard.ZstdDecompressor().decompress(good)
    assert updates.decode_delta(base, unknown.compress(planes)) == base[::-1]
    tiny_window = zstandard.ZstdCompressor(
        compression_params=zstandard.ZstdCompressionParameters(window_log=10, write_content_size=False)
    )
    for bomb, why in (
        (good + updates.encode_delta(base, base), "more than"),  # a second frame
        (tiny_window.compress(bytes(64 * 2**20)), "more than"),  # 64 MiB of unknown size
        (unknown.compress(planes[:-1]), "holds 65535"),
        (unknown.compress(bytes(2**22)), "window"),  # a window beyond the base
        (good[:-3], "holds 65533"),  # cut short
    ):
        peak, message = peak_bytes(updates.decode_delta, base, bomb)
        assert why in message
        assert peak < 2 * len(base) + 2**16, f"{peak} bytes allocated for a {len(base)}-byte base"


BASE_Q = "model.layers.0.self_attn.q_proj.weight"
PEFT_Q = "base_model.model.model.layers.0.self_attn.q_proj"


def adapter_file(rank=2, alpha=4.0, a=None, b=None, meta=None):
    from safetensors.numpy import save

    a = np.full((rank, 8), 0.1, np.float32) if a is None else a
    b = np.full((8, rank), 0.1, np.float32) if b is None else b
    return save(
        {PEFT_Q + ".lora_A.weight": a, PEFT_Q + ".lora_B.weight": b},
        metadata=updates.lora_metadata(rank, alpha) if meta is None else meta,
    )


def base_file():
    from safetensors.numpy import save

    return save({BASE_Q: np.eye(8, dtype=np.float32), "model.norm.weight": np.ones(8, np.float32)})


def test_a_sane_adapter_merges():
    from safetensors.numpy import load

    merged = load(updates.merge_lora(base_file(), adapter_file()))[BASE_Q]
    np.testing.assert_allclose(merged, np.eye(8) + 2.0 * 2 * 0.01, rtol=1e-6)


@pytest.mark.parametrize(
    "adapter, why",
    [
        (adapter_file(alpha=1e38), "alpha/rank"),
        (adapter_file(alpha=float("nan")), "not a finite number"),
        (adapter_file(alpha=float("inf")), "not a finite number"),
        (adapter_file(alpha=-1e38), "alpha/rank"),
        (adapter_file(meta={"lora": '{"alpha": 1e999, "rank": 2}'}), "not a finite number"),
        (adapter_file(meta={"lora": '{"alpha": 4, "rank": -2}'}), "rank -2"),
        (adapter_file(meta={"lora": '{"alpha": 4, "rank": 0}'}), "rank 0"),
        (adapter_file(meta={"lora": '{"alpha": 4, "rank": 2.5}'}), "rank 2.5"),
        (adapter_file(meta={"lora": '{"alpha": 4, "rank": 3}'}), "not rank 3"),
        (adapter_file(meta={}), "not a LoRA adapter"),
        (adapter_file(a=np.full((2, 8), np.nan, np.float32)), "not finite"),
        (adapter_file(b=np.full((8, 2), np.inf, np.float32)), "not finite"),
        (adapter_file(b=np.full((8, 2), 1e30, np.float32)), "beyond"),
        (adapter_file(rank=9, a=np.zeros((9, 8), np.float32), b=np.zeros((8, 9), np.float32)), "exceeds its 8x8"),
        (adapter_file(a=np.zeros((2, 16), np.float32)), "does not fit the base"),
        (adapter_file(b=np.zeros((4, 2), np.float32)), "does not fit the base"),
    ],
)
def test_an_adapter_beyond_the_limits_is_refused_before_merging(adapter, why):
    with pytest.raises(UpdateRefused, match=why):
        updates.merge_lora(base_file(), adapter)


def lie(adapter, header_len=None, header=None):
    """``adapter`` with its header length or header replaced."""
    n = int.from_bytes(adapter[:8], "little")
    text = adapter[8 : 8 + n] if header is None else header
    return (len(text) if header_len is None else header_len).to_bytes(8, "little") + text + adapter[8 + n :]


def test_an_adapter_whose_header_lies_is_refused():
    good = adapter_file()
    n = int.from_bytes(good[:8], "little")
    header = json.loads(good[8 : 8 + n])
    too_far = dict(
        header, **{PEFT_Q + ".lora_A.weight": dict(header[PEFT_Q + ".lora_A.weight"], data_offsets=[0, 2**40])}
    )
    wrong_shape = dict(header, **{PEFT_Q + ".lora_B.weight": dict(header[PEFT_Q + ".lora_B.weight"], shape=[2**20, 2])})
    for bad in (
        lie(good, header_len=2**63),
        lie(good, header_len=len(good)),
        lie(good, header=b" " * (2 * 2**20)),  # beyond max_adapter_header_kib
        lie(good, header=json.dumps(too_far).encode()),
        lie(good, header=json.dumps(wrong_shape).encode()),
        lie(good, header=b"[" * 100_000),
        good[:7],
    ):
        peak, _ = peak_bytes(updates.merge_lora, base_file(), bad)
        assert peak < len(bad) + 2**20
    limits = UpdateLimits(max_adapter_header_kib=16)
    with pytest.raises(UpdateRefused, match="header"):
        updates.check_adapter(lie(good, header=good[8 : 8 + n] + b" " * 20_000), limits)


def test_the_llama_cpp_adapter_writer_refuses_what_llama_cpp_would_load(tmp_path):
    pytest.importorskip("gguf")
    from protocol.models.gguf_lora import write_lora_gguf

    config = config_json(build_model(ModelShape()))
    hidden = json.loads(config)["hidden_size"]
    a, b = np.full((2, hidden), 0.1, np.float32), np.full((hidden, 2), 0.1, np.float32)
    nan = np.full((2, hidden), np.nan, np.float32)
    for tensors, alpha, why in (
        ({PEFT_Q + ".lora_A.weight": a, PEFT_Q + ".lora_B.weight": b}, float("inf"), "alpha"),
        ({PEFT_Q + ".lora_A.weight": nan, PEFT_Q + ".lora_B.weight": b}, 4.0, "not finite"),
        (
            {
                PEFT_Q + ".lora_A.weight": np.zeros((hidden + 1, hidden), np.float32),
                PEFT_Q + ".lora_B.weight": np.zeros((hidden, hidden + 1), np.float32),
            },
            4.0,
            "exceeds",
        ),
    ):
        with pytest.raises(UpdateRefused, match=why):
            write_lora_gguf(config, tensors, alpha, tmp_path / "lora.gguf")
        assert not (tmp_path / "lora.gguf").exists()
