"""One pytest-xdist worker at a time, and something costly made once per run.

``make test`` runs on two workers. Two things need the workers to agree:
tests that must not overlap (``one_at_a_time``: the network namespaces of
``tests/net``), and something costly every worker needs, where a session
fixture would be made once per worker (``shared_between_workers``). Both go
through a lock in this run's temporary directory (pytest keeps the last
three runs').
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def one_at_a_time(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """Hold this run's lock ``name`` (waiting for any other worker holding it);
    yields the run's directory, shared by its workers."""
    directory = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        directory = directory.parent  # the run's, above each worker's own
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield directory


@contextlib.contextmanager
def shared_between_workers(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """``(path, exists)`` for this run's file ``name``, held under its lock:
    write the file when it does not exist yet."""
    with one_at_a_time(tmp_path_factory, name) as directory:
        path = directory / name
        yield path, path.exists()
