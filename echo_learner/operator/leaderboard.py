"""``echo-learner ledger``: the contributor leaderboard (credit kept, and
forfeited by peers caught cheating) and the refusals by reason, read straight
from the SQLite ledger in the data dir (the learner need not run)."""

from __future__ import annotations

import argparse
import json

from protocol.process.config import fail


def command(args: argparse.Namespace, prog: str) -> None:
    import sqlite3
    from dataclasses import asdict

    from echo_learner.ledger import Ledger

    if args.limit < 1:
        fail(prog, "--limit must be at least 1")
    try:
        db = Ledger(args.data_dir / "ledger.sqlite", readonly=True)
        rows = db.leaderboard(args.limit)
        refusals = db.refusal_counts()
        db.close()
    except (FileNotFoundError, sqlite3.Error) as exc:
        fail(prog, f"cannot read the ledger: {exc}")
    if args.json:
        print(json.dumps({"contributors": [asdict(r) for r in rows], "refusals": refusals}, indent=2))
        return
    from protocol.process.tables import print_table

    print_table(
        ("#", "peer", "credit", "forfeited", "tokens", "rollouts", "accepted", "refused"),
        (
            (i, r.peer, f"{r.credit:.0f}", f"{r.forfeited:.0f}", r.tokens, r.rollouts, r.accepted, r.refused)
            for i, r in enumerate(rows, 1)
        ),
        numeric=("#", "credit", "forfeited", "tokens", "rollouts", "accepted", "refused"),
    )
    if refusals:
        print("refused: " + ", ".join(f"{k} {v}" for k, v in sorted(refusals.items())))
