import dataclasses

import pytest

from protocol import codec, manifest
from protocol.errors import ChunkHashMismatch, DecodeError, SignatureError
from protocol.ids import manifest_key, manifest_keys
from protocol.net.records import InvalidRecord, ManifestRecordValidator

from .samples import LEARNER, NODE

WEIGHTS = bytes(range(256)) * 40  # 10,240 bytes


def build(version=1, identity=LEARNER, weights=WEIGHTS):
    return manifest.build(
        identity,
        job_id="job",
        version=version,
        parent_version=version - 1,
        task="reverse",
        model_config="{}",
        tokenizer_digest=b"t" * 32,
        weights=weights,
        chunk_size=4096,
    )


def test_chunks_reassemble_and_verify():
    signed, chunks = build()
    assert [len(c) for c in chunks] == [4096, 4096, 2048]
    manifest.check(signed, LEARNER.peer_id_str)
    for i, c in enumerate(chunks):
        manifest.check_chunk(signed, i, c)
    assert b"".join(chunks) == WEIGHTS


def test_tampered_chunk_is_refused():
    signed, chunks = build()
    bad = bytearray(chunks[1])
    bad[100] ^= 1
    with pytest.raises(ChunkHashMismatch):
        manifest.check_chunk(signed, 1, bytes(bad))
    with pytest.raises(ChunkHashMismatch):
        manifest.check_chunk(signed, 2, chunks[2] + b"x")
    with pytest.raises(ChunkHashMismatch):
        manifest.check_chunk(signed, 3, b"")


def test_manifest_from_another_key_is_refused():
    signed, _ = build(identity=NODE)
    with pytest.raises(DecodeError):
        manifest.check(signed, LEARNER.peer_id_str)
    forged = dataclasses.replace(signed, learner_id=LEARNER.peer_id_str)
    with pytest.raises(SignatureError):
        manifest.check(forged, LEARNER.peer_id_str)


def test_tampered_chunk_list_breaks_signature():
    signed, _ = build()
    forged = dataclasses.replace(signed, chunk_hashes=(b"x" * 32, *signed.chunk_hashes[1:]))
    with pytest.raises(SignatureError):
        manifest.check(forged)


def test_dht_record_validator():
    v = ManifestRecordValidator()
    key = manifest_key(LEARNER.peer_id_str)
    old = codec.encode(build(version=1)[0])
    new = codec.encode(build(version=5)[0])
    v.validate(key, old)
    assert v.select(key, [old, new, old]) == 1
    # A record under the learner's key but signed by someone else.
    with pytest.raises(InvalidRecord):
        v.validate(key, codec.encode(build(identity=NODE)[0]))
    with pytest.raises(InvalidRecord):
        v.validate(key, b"garbage")
    with pytest.raises(InvalidRecord):
        v.validate("/other/" + LEARNER.peer_id_str, old)


def test_dht_record_validator_takes_both_keys_of_the_signer_and_no_one_elses():
    """The hashed key and, during the deprecation window, the legacy one."""
    v = ManifestRecordValidator()
    record = codec.encode(build(version=1)[0])
    for key in manifest_keys(LEARNER.peer_id_str):
        v.validate(key, record)
    for key in manifest_keys(NODE.peer_id_str):
        with pytest.raises(InvalidRecord):
            v.validate(key, record)
