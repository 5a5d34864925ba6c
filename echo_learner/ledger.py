"""The contributor ledger: one SQLite row per verdict, written before the receipt is sent.

WAL mode, ``synchronous=FULL`` and one committed transaction per verdict: once
a node holds a receipt, the row behind it (and, for an accepted batch, the
batch itself) survives a crash or power cut. Every version the learner
publishes is also recorded, so a restarted learner never reuses a version
number nodes may already hold.

Credit rule: one credit per completion token of an accepted batch (every
token was verified against the learner's own log-probs and scored by the
learner), counting a completion repeated within its group once; a refused
batch earns nothing. A peer caught generating otherwise than it declares
(``echo_learner.verify.evidence``) forfeits all its credit: one row in
``forfeits``, which the leaderboard subtracts (its verdict rows and the
receipts behind them stay as they were).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from protocol import codec

if TYPE_CHECKING:
    from protocol.wire.rollout import Receipt

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
    receipt     BLOB NOT NULL,
    batch       BLOB
);
CREATE INDEX IF NOT EXISTS verdicts_peer ON verdicts (peer, id);
CREATE UNIQUE INDEX IF NOT EXISTS verdicts_accepted_nonce
    ON verdicts (peer, nonce) WHERE verdict = 'accepted';
CREATE TABLE IF NOT EXISTS forfeits (
    peer        TEXT PRIMARY KEY,
    reason      TEXT NOT NULL,
    credit      REAL NOT NULL,
    created_ms  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
    version     INTEGER PRIMARY KEY,
    step        INTEGER NOT NULL,
    created_ms  INTEGER NOT NULL,
    manifest    BLOB NOT NULL
);
"""

CREDIT_PER_TOKEN = 1.0


def now_ms() -> int:
    """Wall-clock milliseconds: the time rows, receipts and deadlines carry."""
    return int(time.time() * 1000)


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
    receipt: bytes  # the signed Receipt as sent (empty when none could be made)
    batch: bytes | None = None  # the RolloutBatch as it came (its frame), kept for accepted ones

    @classmethod
    def of_receipt(cls, receipt: Receipt, *, peer: str, nonce: bytes, rollouts: int, batch: bytes | None) -> Row:
        """The row behind ``receipt``, a verdict on a batch ``peer`` sent (the
        sender on the connection: a forged batch may claim another signer)."""
        return cls(
            batch_hash=receipt.batch_hash,
            peer=peer,
            version=receipt.version,
            nonce=nonce,
            rollouts=rollouts,
            tokens=receipt.tokens,
            verdict=receipt.verdict,
            reason=receipt.reason,
            credit=receipt.credit,
            created_ms=receipt.created_ms,
            receipt=codec.encode(receipt),
            batch=batch,
        )

    @classmethod
    def unread(cls, peer: str, reason: str, created_ms: int) -> Row:
        """A refusal of a batch that could not be decoded: nothing of it is
        known (hash, version, nonce), so no receipt can be made for it."""
        return cls(
            batch_hash=bytes(32),
            peer=peer,
            version=0,
            nonce=b"",
            rollouts=0,
            tokens=0,
            verdict="refused",
            reason=reason,
            credit=0.0,
            created_ms=created_ms,
            receipt=b"",
        )


@dataclass(frozen=True)
class Standing:
    peer: str
    accepted: int
    refused: int
    rollouts: int
    tokens: int
    credit: float  # what it keeps: earned less forfeited
    forfeited: float = 0.0


class Ledger:
    def __init__(self, path: Path, *, readonly: bool = False):
        if readonly:
            if not path.exists():
                raise FileNotFoundError(f"no ledger at {path}")
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
            if not self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'forfeits'").fetchone():
                # A ledger from before forfeits: an empty stand-in, in memory.
                self.db.execute("CREATE TEMP TABLE forfeits (peer TEXT, reason TEXT, credit REAL, created_ms INTEGER)")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    # --- writes ------------------------------------------------------------------

    def record(self, row: Row) -> int:
        """Write one verdict durably (committed before this returns); its id."""
        with self.db:
            cur = self.db.execute(
                "INSERT INTO verdicts (batch_hash, peer, version, nonce, rollouts, tokens,"
                " verdict, reason, credit, created_ms, receipt, batch)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.batch_hash,
                    row.peer,
                    row.version,
                    row.nonce,
                    row.rollouts,
                    row.tokens,
                    row.verdict,
                    row.reason,
                    row.credit,
                    row.created_ms,
                    row.receipt,
                    row.batch,
                ),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def forfeit(self, peer: str, reason: str, created_ms: int) -> float:
        """``peer`` was caught (``reason``): it forfeits all the credit it has
        earned; the amount (0 when it was caught before)."""
        with self.db:
            (earned,) = self.db.execute(
                "SELECT COALESCE(SUM(credit), 0) FROM verdicts WHERE peer = ?", (peer,)
            ).fetchone()
            cur = self.db.execute(
                "INSERT OR IGNORE INTO forfeits (peer, reason, credit, created_ms) VALUES (?, ?, ?, ?)",
                (peer, reason, earned, created_ms),
            )
        return earned if cur.rowcount else 0.0

    def caught(self) -> dict[str, str]:
        """Every peer that forfeited its credit, and why."""
        return dict(self.db.execute("SELECT peer, reason FROM forfeits").fetchall())

    def record_version(self, version: int, step: int, created_ms: int, manifest: bytes) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO versions (version, step, created_ms, manifest) VALUES (?, ?, ?, ?)",
                (version, step, created_ms, manifest),
            )

    # --- reads -------------------------------------------------------------------

    def last_version(self) -> int:
        """The newest version ever published from this data dir (-1: none)."""
        (v,) = self.db.execute("SELECT COALESCE(MAX(version), -1) FROM versions").fetchone()
        return v

    def last_id(self) -> int:
        (i,) = self.db.execute("SELECT COALESCE(MAX(id), 0) FROM verdicts").fetchone()
        return i

    def nonce_accepted(self, peer: str, nonce: bytes) -> bool:
        cur = self.db.execute(
            "SELECT 1 FROM verdicts WHERE peer = ? AND nonce = ? AND verdict = 'accepted'",
            (peer, nonce),
        )
        return cur.fetchone() is not None

    def receipts(self, peer: str, after_id: int, limit: int) -> list[tuple[int, bytes]]:
        """(id, signed receipt) of ``peer``'s verdicts after ``after_id``, oldest first."""
        return list(
            self.db.execute(
                "SELECT id, receipt FROM verdicts WHERE peer = ? AND id > ? AND receipt != x'' ORDER BY id LIMIT ?",
                (peer, after_id, limit),
            )
        )

    def leaderboard(self, limit: int = 100) -> list[Standing]:
        """Every contributor's totals, most credit first."""
        rows = self.db.execute(
            "SELECT v.peer, v.accepted, v.refused, v.rollouts, v.tokens,"
            " v.credit - COALESCE(f.credit, 0) AS kept, COALESCE(f.credit, 0)"
            " FROM (SELECT peer,"
            "  SUM(verdict = 'accepted') AS accepted, SUM(verdict = 'refused') AS refused,"
            "  SUM(rollouts * (verdict = 'accepted')) AS rollouts, SUM(tokens) AS tokens, SUM(credit) AS credit"
            "  FROM verdicts GROUP BY peer) AS v"
            " LEFT JOIN forfeits AS f ON f.peer = v.peer"
            " ORDER BY kept DESC, v.peer LIMIT ?",
            (limit,),
        )
        return [Standing(*r) for r in rows]

    def refusals(self, limit: int = 50) -> list[dict]:
        """The newest refused verdicts."""
        rows = self.db.execute(
            "SELECT id, peer, version, reason, created_ms FROM verdicts"
            " WHERE verdict = 'refused' ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        keys = ("id", "peer", "version", "reason", "created_ms")
        return [dict(zip(keys, r)) for r in rows]

    def refusal_counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT reason, COUNT(*) FROM verdicts WHERE verdict = 'refused' GROUP BY reason")
        return dict(rows.fetchall())

    def close(self) -> None:
        self.db.close()
