"""Cheating volunteers against a real swarm: how soon each is refused, and what credit it keeps.

Part (1), ``--only swarms``. For each cheat of bench/cheats.py (the project's
own node with one thing changed) and each learner mode (``--modes``: sync,
async), a fresh swarm of real processes on 127.0.0.1: a bootstrap peer, a
learner training SmolLM2-135M-Instruct with LoRA r16 on two-term sums at
temperature 0.7 (groups of 8, one prompt per assignment, answers of up to
48 tokens), one honest llama.cpp q8_0 node and the cheater. It runs until
the cheater has a batch refused for a reason only a dishonest node earns
(a strike) or ``--max-batches`` of its batches were judged, and the honest
node has ``--honest-batches`` accepted (each within ``--scenario-timeout-s``):
the credit each kept is counted over that run. The LoRA adapter a cheater drops is drawn
non-zero from the start (``--lora-init-scale 0.01``, ~0.16 nats a token on
SmolLM2's answers): with a zero adapter there is nothing to drop.

Per cheat and mode: ``batches_to_refusal`` (the cheater's batches judged up
to and including its first struck refusal), ``reason``, ``credit_share`` (the
cheater's credit kept over the run / the honest node's), and the honest
node's struck refusals (``honest_refused``, must be 0).

Part (2), ``--only honest``: bench/plausibility.py's honest rollouts of every
CPU row (torch f32, f16, bf16; llama.cpp f32, f16, q8_0) on ``--models``,
judged as the learner judges one node's batches (per-batch bounds and the
evidence over all of them): ``honest_false_rejects`` over
``honest_rollouts_checked``, and ``rows`` (each row's bounds, the honest
worst, mean and batch mean, the emulation ratios and how far each evidence
test got).

    python bench/cheaters.py --json                       # both parts (~3 hours on 2 cores)
    python bench/cheaters.py --only swarms --cheats q4_0,greedy --modes sync

Targets (issue 50): ``batches_to_refusal`` <= 32 for every cheat and mode,
its median <= 8, ``credit_share`` <= 0.10; ``honest_false_rejects`` 0 with
>= 10,000 honest rollouts per CPU row on >= 2 models.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

from cheats import CHEATS  # noqa: E402
from harness import read_ledger  # noqa: E402
from localswarm import local_swarm  # noqa: E402

from echo_learner.verify.verifier import STRIKES  # noqa: E402
from protocol.identity import load_or_create  # noqa: E402

CHEATS_PY = str(Path(__file__).resolve().parent / "cheats.py")
LEARNER = (
    "--model", "smollm2", "--task", "math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1",
    "--temperature", "0.7", "--lora", "16", "--lr", "2e-4", "--group-size", "8", "--prompts-per-step", "4",
    "--prompts-per-request", "1", "--max-new-tokens", "48", "--torch-threads", "1", "--steps", "100000",
    "--eval-every", "0",
    "--selection-limit", "14", "--twin-share", "0.5",  # off by default (docs/learner.md): on here, for the best of 8
)  # fmt: skip
HONEST = ("--backend", "llama", "--dtype", "q8_0", "--threads", "1")


def verdicts(ledger: Path) -> list[tuple[str, str, str, float]]:
    """(peer, verdict, reason, credit) of every row, oldest first."""
    if not ledger.exists():
        return []
    return read_ledger(ledger, "SELECT peer, verdict, reason, credit FROM verdicts ORDER BY id")


def forfeited(ledger: Path) -> dict[str, float]:
    return dict(read_ledger(ledger, "SELECT peer, credit FROM forfeits"))


def first_strike(rows: list[tuple[str, str, str, float]], peer: str) -> tuple[int, str] | None:
    """How many of ``peer``'s batches were judged up to its first struck
    refusal (and the reason), or None."""
    mine = [r for r in rows if r[0] == peer]
    return next(((i, r[2]) for i, r in enumerate(mine, start=1) if r[2] in STRIKES), None)


def scenario(name: str, mode: str, root: Path, args: argparse.Namespace) -> dict:
    cheat = CHEATS[name]
    honest = load_or_create(root / "node0" / "identity.key").peer_id_str
    cheater = load_or_create(root / "node1" / "identity.key").peer_id_str
    ledger = root / "learner" / "ledger.sqlite"
    extra = ("--lora-init-scale", "0.01") if cheat.lora else ()
    started = time.monotonic()
    with local_swarm(root) as swarm:
        swarm.start_bootstrap()
        swarm.start_learner(*LEARNER, "--mode", mode, *extra)
        swarm.start_node(0, *HONEST, "--name", "honest")
        swarm.start_node(
            1, "--backend", cheat.backend, "--dtype", cheat.dtype, "--threads", "1", "--name", "cheater",
            program=(CHEATS_PY, name, "--"),
        )  # fmt: skip

        def judged() -> bool:
            rows = verdicts(ledger)
            return first_strike(rows, cheater) is not None or sum(r[0] == cheater for r in rows) >= args.max_batches

        def run_long_enough() -> bool:
            return sum(r[0] == honest and r[1] == "accepted" for r in verdicts(ledger)) >= args.honest_batches

        caught_at = None
        try:
            swarm.wait_until(judged, args.scenario_timeout_s, f"{name}: the cheater refused or judged enough")
            caught_at = time.monotonic()
            swarm.wait_until(run_long_enough, args.scenario_timeout_s, f"{name}: the honest node's batches")
        except AssertionError as exc:  # timed out, or a process died: reported, the next scenario runs
            print(f"{name} ({mode}): {str(exc)[:300]}", file=sys.stderr)
        codes = swarm.stop_all()
    rows = verdicts(ledger)
    kept = {p: 0.0 for p in (honest, cheater)}
    for peer, _, _, credit in rows:
        kept[peer] = kept.get(peer, 0.0) + credit
    for peer, credit in forfeited(ledger).items():
        kept[peer] -= credit
    strike = first_strike(rows, cheater)
    honest_refused = [r[2] for r in rows if r[0] == honest and r[2] in STRIKES]
    return {
        "batches_to_refusal": strike[0] if strike else None,
        "reason": strike[1] if strike else None,
        "cheater_batches": sum(r[0] == cheater for r in rows),
        "cheater_accepted": sum(r[0] == cheater and r[1] == "accepted" for r in rows),
        "honest_batches": sum(r[0] == honest for r in rows),
        "honest_refused": len(honest_refused),
        "credit_share": round(kept[cheater] / kept[honest], 4) if kept[honest] > 0 else None,
        "credit_forfeited": round(forfeited(ledger).get(cheater, 0.0)),
        "caught_after_s": round(caught_at - started, 1) if caught_at else None,
        "run_s": round(time.monotonic() - started, 1),
        "exit_codes": codes,
    }


def swarms(args: argparse.Namespace, log: bool) -> dict:
    out: dict = {}
    for name in args.cheats:
        out[name] = {}
        for mode in args.modes:
            with tempfile.TemporaryDirectory(prefix=f"echo-cheat-{name}-{mode}-") as tmp:
                result = scenario(name, mode, Path(tmp), args)
                if args.keep:
                    kept = Path(tempfile.mkdtemp(prefix=f"echo-cheat-{name}-{mode}-kept-"))
                    for log_file in Path(tmp).glob("*.log"):
                        (kept / log_file.name).write_bytes(log_file.read_bytes())
                    result["logs"] = str(kept)
            out[name][mode] = result
            if log:
                print(f"{name} ({mode}): {json.dumps(result)}", file=sys.stderr, flush=True)
    return out


def verdict(results: dict) -> dict:
    """The targets, from part (1)'s results."""
    runs = [r for modes in results.values() for r in modes.values()]
    counts = [r["batches_to_refusal"] for r in runs]
    caught = [c for c in counts if c is not None]
    shares = [r["credit_share"] for r in runs]
    return {
        "median_batches_to_refusal": statistics.median(caught) if caught else None,
        "most_batches_to_refusal": max(caught) if caught else None,
        "never_refused": [f"{n}/{m}" for n, modes in results.items() for m, r in modes.items() if r["reason"] is None],
        "most_credit_share": max((s for s in shares if s is not None), default=None),
        "swarm_honest_refused": sum(r["honest_refused"] for r in runs),
        "targets_met": bool(
            caught
            and len(caught) == len(counts)
            and max(caught) <= 32
            and statistics.median(caught) <= 8
            and all(s is not None and s <= 0.10 for s in shares)
            and not any(r["honest_refused"] for r in runs)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("swarms", "honest"), help="one part (default: both)")
    parser.add_argument("--cheats", default=",".join(CHEATS), help="comma-separated, of: " + ", ".join(CHEATS))
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--max-batches", type=int, default=40, help="cheater batches judged before giving up on it")
    parser.add_argument("--scenario-timeout-s", type=float, default=900.0)
    parser.add_argument(
        "--honest-batches", type=int, default=16, help="the run goes on until the honest node has this many accepted"
    )
    parser.add_argument("--models", default="builtin,qwen3,smollm2", help="part (2): bench/plausibility.py's models")
    parser.add_argument(
        "--rollouts", default="builtin=10000,qwen3=10000,smollm2=400", help="part (2): honest rollouts per row"
    )
    parser.add_argument("--keep", action="store_true", help="keep each swarm's logs")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    args.cheats = [c for c in args.cheats.split(",") if c]
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [c for c in args.cheats if c not in CHEATS] + [m for m in args.modes if m not in ("sync", "async")]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    started = time.monotonic()
    out: dict = {}
    if args.only in (None, "swarms"):
        out["cheaters"] = swarms(args, not args.json)
        out.update(verdict(out["cheaters"]))
    if args.only in (None, "honest"):
        import random

        from plausibility import measure, per_model

        models = [m for m in args.models.split(",") if m]
        rows = measure(models, per_model(args.rollouts, models), "cpu", random.Random(0), not args.json)
        out["rows"] = rows
        out["honest_rollouts_checked"] = {
            row: {m: rows[m][row]["rollouts"] for m in models} for row in next(iter(rows.values()))
        }
        out["honest_false_rejects"] = sum(r["false_rejects"] for m in rows.values() for r in m.values())
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
