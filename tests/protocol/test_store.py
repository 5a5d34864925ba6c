import os
import random

import pytest

from protocol import manifest
from protocol.broadcast.store import VersionStore
from protocol.errors import ChunkHashMismatch

from .samples import LEARNER, NODE


def version(v, weights=None, identity=LEARNER):
    weights = weights if weights is not None else random.Random(v).randbytes(5000)
    return manifest.build(
        identity,
        job_id="job",
        version=v,
        parent_version=v - 1,
        task="t",
        model_config="{}",
        tokenizer_digest=bytes(32),
        weights=weights,
        chunk_size=2048,
    )


def store(tmp_path, keep=2):
    return VersionStore(tmp_path / "w", learner_id=LEARNER.peer_id_str, keep=keep)


def test_resume_after_restart(tmp_path):
    m, chunks = version(1)
    s = store(tmp_path)
    s.add_manifest(m)
    s.write(1, 0, chunks[0])
    s.write(1, 2, chunks[2])
    again = store(tmp_path)
    assert again.chunks_held(1) == {0, 2} and not again.complete(1)
    again.write(1, 1, chunks[1])
    assert again.complete(1) and again.assemble(1) == b"".join(chunks)


def test_damaged_chunk_on_disk_is_dropped_at_load(tmp_path):
    m, chunks = version(1)
    s = store(tmp_path)
    s.add_manifest(m)
    for i, c in enumerate(chunks):
        s.write(1, i, c)
    path = tmp_path / "w" / "chunks" / m.chunk_hashes[1].hex()
    path.write_bytes(b"torn")
    assert store(tmp_path).chunks_held(1) == {0, 2}


def test_bad_chunk_is_not_written(tmp_path):
    m, chunks = version(1)
    s = store(tmp_path)
    s.add_manifest(m)
    with pytest.raises(ChunkHashMismatch):
        s.write(1, 0, chunks[1])
    assert s.chunks_held(1) == frozenset() and s.read(1, 0) is None
    assert os.listdir(tmp_path / "w" / "chunks") == []


def test_only_the_newest_versions_are_kept(tmp_path):
    s = store(tmp_path, keep=2)
    for v in range(4):
        m, chunks = version(v)
        s.add_manifest(m)
        for i, c in enumerate(chunks):
            s.write(v, i, c)
    assert sorted(s.manifests) == [2, 3]
    assert s.disk_bytes() == 2 * 5000
    assert sorted(os.listdir(tmp_path / "w" / "manifests")) == ["2.msgpack", "3.msgpack"]


def test_shared_chunks_count_for_a_new_version(tmp_path):
    s = store(tmp_path)
    m1, chunks = version(1, weights=b"a" * 4096 + b"b" * 904)
    s.add_manifest(m1)
    for i, c in enumerate(chunks):
        s.write(1, i, c)
    m2, _ = version(2, weights=b"a" * 4096 + b"c" * 904)
    s.add_manifest(m2)
    assert s.chunks_held(2) == {0, 1}  # the unchanged chunks are already here


def test_manifest_from_someone_else_is_refused(tmp_path):
    m, _ = version(1, identity=NODE)
    with pytest.raises(Exception):
        store(tmp_path).add_manifest(m)


def test_a_chunk_being_written_survives_pruning_and_is_not_counted_until_renamed(tmp_path):
    """A worker thread's half-written chunk (its temporary file) is neither
    removed by another version's pruning nor counted on disk; a crash's
    leftovers go when the store opens again."""
    s = store(tmp_path, keep=1)
    m, chunks = version(1)
    s.add_manifest(m)
    writing = tmp_path / "w" / "chunks" / f"{m.chunk_hashes[0].hex()}.123-456.tmp"
    writing.write_bytes(chunks[0][:100])
    m2, chunks2 = version(2)
    s.add_manifest(m2)  # drops version 1 and its chunks
    for i, c in enumerate(chunks2):
        s.write(2, i, c)
    assert writing.exists()
    assert s.disk_bytes() == 5000
    store(tmp_path, keep=1)  # a restart: nothing is being written
    assert not writing.exists()
