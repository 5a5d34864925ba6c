"""What the long benchmarks share, beside ``scripts/localswarm.py`` (which
starts a swarm): reading the learner's ledger while it runs, a node's
receipts, pinning a process to cores, and printing the result.

The ledger is read through a read-only SQLite connection (the learner keeps
writing; WAL lets both go on), over windows of ``created_ms``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path


def read_ledger(path: Path, sql: str, params: Iterable = (), *, timeout_s: float = 30) -> list[tuple]:
    """The rows ``sql`` selects from the ledger at ``path`` ([] before the
    learner has made its tables)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s)
    try:
        return db.execute(sql, tuple(params)).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        db.close()


def accepted_in(path: Path, since_ms: int, until_ms: int) -> dict[str, tuple[int, int]]:
    """Each peer's accepted batches and their tokens, created in [since_ms, until_ms)."""
    rows = read_ledger(
        path,
        "SELECT peer, COUNT(*), COALESCE(SUM(tokens), 0) FROM verdicts"
        " WHERE verdict = 'accepted' AND created_ms >= ? AND created_ms < ? GROUP BY peer",
        (since_ms, until_ms),
    )
    return {peer: (batches, tokens) for peer, batches, tokens in rows}


def ledger_verdicts(path: Path) -> list[tuple[str, str]]:
    """(batch hash in hex, verdict) of every row of the ledger, in order."""
    return [(bytes(h).hex(), v) for h, v in read_ledger(path, "SELECT batch_hash, verdict FROM verdicts ORDER BY id")]


def node_receipts(data_dir: Path) -> list[dict]:
    """The receipts a node wrote down (``receipts.jsonl``, its rotated file first)."""
    receipts = []
    for path in (data_dir / "receipts.jsonl.1", data_dir / "receipts.jsonl"):
        if path.exists():
            receipts += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return receipts


def pinned(cpus: set[int]) -> Callable[[], None] | None:
    """A ``preexec_fn`` that pins the process to ``cpus`` (None: no pinning)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def print_result(result: dict, as_json: bool) -> None:
    """One JSON line, or one aligned ``key value`` line per figure."""
    if as_json:
        print(json.dumps(result))
        return
    width = max(map(len, result)) + 2
    for k, v in result.items():
        print(f"{k:{width}} {v}")
