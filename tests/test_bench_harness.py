"""bench/harness.py reads a real ledger as the learner writes it (SQLite, read-only)."""

import json
import sqlite3

import pytest
from harness import accepted_in, ledger_verdicts, node_receipts, read_ledger

from echo_learner.ledger import Ledger, Row


def row(peer: str, verdict: str, created_ms: int, tokens: int, tag: int) -> Row:
    return Row(
        batch_hash=bytes([tag]) * 32,
        peer=peer,
        version=1,
        nonce=bytes([tag]) * 16,
        rollouts=4,
        tokens=tokens,
        verdict=verdict,
        reason="ok" if verdict == "accepted" else "bad_tokens",
        credit=float(tokens) if verdict == "accepted" else 0.0,
        created_ms=created_ms,
        receipt=b"",
    )


def test_a_window_counts_each_peer_s_accepted_batches_and_tokens(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    try:
        assert accepted_in(path, 0, 10_000) == {}
        for tag, (peer, verdict, at, tokens) in enumerate(
            [
                ("a", "accepted", 1_000, 10),
                ("a", "accepted", 2_000, 20),
                ("b", "refused", 2_500, 5),
                ("b", "accepted", 3_000, 7),
                ("a", "accepted", 5_000, 99),
            ]  # fmt: skip
        ):
            ledger.record(row(peer, verdict, at, tokens, tag))
        # [1,000, 5,000): the last batch of a is outside, b's refusal never counts.
        assert accepted_in(path, 1_000, 5_000) == {"a": (2, 30), "b": (1, 7)}
        assert [v for _, v in ledger_verdicts(path)] == ["accepted", "accepted", "refused", "accepted", "accepted"]
        assert ledger_verdicts(path)[2][0] == (bytes([2]) * 32).hex()
        with pytest.raises(sqlite3.OperationalError):  # read-only: the learner's data is safe from a bench
            read_ledger(path, "DELETE FROM verdicts")
    finally:
        ledger.close()


def test_a_ledger_before_its_tables_reads_empty(tmp_path):
    path = tmp_path / "ledger.sqlite"
    sqlite3.connect(path).close()  # the file exists, the learner has not made its tables yet
    assert read_ledger(path, "SELECT peer FROM verdicts") == []


def test_a_node_s_receipts_include_its_rotated_file_first(tmp_path):
    (tmp_path / "receipts.jsonl.1").write_text(json.dumps({"batch_hash": "aa", "verdict": "accepted"}) + "\n")
    (tmp_path / "receipts.jsonl").write_text(json.dumps({"batch_hash": "bb", "verdict": "refused"}) + "\n\n")
    assert [r["batch_hash"] for r in node_receipts(tmp_path)] == ["aa", "bb"]
    assert node_receipts(tmp_path / "missing") == []
