"""The contributor ledger: one SQLite row per verdict, written before the receipt is sent.

WAL mode and a committed transaction per verdict: once a node holds a receipt,
the row behind it survives a crash.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    id          INTEGER PRIMARY KEY,
    batch_hash  BLOB NOT NULL,
    peer        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    nonce       BLOB NOT NULL,
    rollouts    INTEGER NOT NULL,
    tokens      INTEGER NOT NULL,
    verdict     TEXT NOT NULL CHECK (verdict IN ('accepted', 'refused')),
    reason      TEXT NOT NULL,
    credit      REAL NOT NULL,
    created_ms  INTEGER NOT NULL,
    receipt     BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS verdicts_peer ON verdicts (peer);
CREATE UNIQUE INDEX IF NOT EXISTS verdicts_accepted_nonce
    ON verdicts (peer, nonce) WHERE verdict = 'accepted';
"""


@dataclass(frozen=True)
class Row:
    batch_hash: bytes
    peer: str
    version: int
    nonce: bytes
    rollouts: int
    tokens: int
    verdict: str
    reason: str
    credit: float
    created_ms: int
    receipt: bytes


class Ledger:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def record(self, row: Row) -> None:
        """Write one verdict durably (committed before this returns)."""
        with self.db:
            self.db.execute(
                "INSERT INTO verdicts (batch_hash, peer, version, nonce, rollouts, tokens,"
                " verdict, reason, credit, created_ms, receipt)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.batch_hash, row.peer, row.version, row.nonce, row.rollouts,
                    row.tokens, row.verdict, row.reason, row.credit, row.created_ms,
                    row.receipt,
                ),
            )

    def nonce_accepted(self, peer: str, nonce: bytes) -> bool:
        cur = self.db.execute(
            "SELECT 1 FROM verdicts WHERE peer = ? AND nonce = ? AND verdict = 'accepted'",
            (peer, nonce),
        )
        return cur.fetchone() is not None

    def accepted_hashes(self) -> set[bytes]:
        rows = self.db.execute("SELECT batch_hash FROM verdicts WHERE verdict = 'accepted'")
        return {r[0] for r in rows}

    def leaderboard(self) -> list[tuple[str, int, float]]:
        """(peer, accepted rollouts, credit), most credit first."""
        return list(
            self.db.execute(
                "SELECT peer, SUM(rollouts), SUM(credit) FROM verdicts"
                " WHERE verdict = 'accepted' GROUP BY peer ORDER BY SUM(credit) DESC"
            )
        )

    def close(self) -> None:
        self.db.close()
