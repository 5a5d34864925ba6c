"""The one atomic-write helper: the old file or the new one, never a mix, nothing left on failure."""

import os
import stat

import pytest

from protocol.process.files import replacing, write_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError), replacing(path, durable=True) as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("crashed mid-write")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_the_new_file_replaces_the_old_with_the_mode_asked_for(tmp_path):
    path = tmp_path / "identity.key"
    write_atomic(path, b"\x00secret", durable=True, mode=0o600)
    assert path.read_bytes() == b"\x00secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with replacing(path) as tmp:
        tmp.write_bytes(b"new")
        assert path.read_bytes() == b"\x00secret"  # readers see the old file until the end
    assert path.read_bytes() == b"new"


def test_threads_writing_the_same_file_at_once_do_not_trip_over_each_other(tmp_path):
    """Two peers' copies of one chunk can be saved by two worker threads at once."""
    import threading

    path = tmp_path / "chunk"
    errors = []
    inside = threading.Barrier(2)

    def write(data: bytes) -> None:
        try:
            with replacing(path) as tmp:
                tmp.write_bytes(data)
                inside.wait(timeout=10)  # both temporaries exist before either is renamed
        except Exception as exc:  # noqa: BLE001 - the test reports any failure
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(b"same bytes",)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_bytes() == b"same bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk"]
