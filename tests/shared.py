"""Something costly that every pytest-xdist worker of one run needs, made once.

``make test`` runs on two workers, and a session fixture lives in one process:
both workers would pay for it. The first to get here makes the file, under a
lock, in this run's temporary directory (pytest keeps the last three runs'); the
others wait for it and read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def shared_between_workers(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """``(path, exists)`` for this run's file ``name``, held under its lock:
    write the file when it does not exist yet."""
    directory = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        directory = directory.parent  # the run's, above each worker's own
    path = directory / name
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path, path.exists()
