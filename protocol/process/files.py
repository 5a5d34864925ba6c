"""Files that are never seen half-written: write a temporary file beside the
target, then rename it over the target in one step.

The one helper for it in the tree: small files (status, identity keys, api
addresses) through ``write_atomic``, writers that want a path of their own
(torch.save, the GGUF writer) through ``replacing``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

TMP_SUFFIX = ".tmp"  # what ``replacing`` writes before the rename


@contextlib.contextmanager
def replacing(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; when the block ends it
    replaces ``path`` (readers see the old file or the new one, never a mix).
    If the block raises, ``path`` is left as it was and the temporary file
    removed. ``durable``: the file is fsynced before the rename and the
    directory after it, so that a power loss keeps one of the two whole
    (checkpoints, keys, models); without it only a crash of this process is
    covered.

    The temporary name is this thread's own (``<name>.<pid>-<thread>.tmp``):
    two threads writing the same file (two peers' copies of one chunk) would
    otherwise write into, and rename away, each other's temporary file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}{TMP_SUFFIX}")
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, data: bytes | str, *, durable: bool = False, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` in one step (``replacing``); a new file
    gets ``mode`` (less the umask)."""
    with replacing(path, durable=durable) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
