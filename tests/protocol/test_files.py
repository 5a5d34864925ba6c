"""The one atomic-write helper: the old file or the new one, never a mix, nothing left on failure."""

import os
import stat

import pytest

from protocol.files import replacing, write_atomic


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
