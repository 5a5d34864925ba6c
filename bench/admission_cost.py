"""What one change of the swarm costs the learner's admission: a work
request's take, then the view the next request reads (issue 52).

A pool and a peer book of N measured, proven peers each holding prompts;
then, ``--changes`` times, one random peer asks for work, takes a prompt, and
the view is read, as the learner does on every work request. Measured in the
same run two ways: the view kept and brought up to date peer by peer (what
the learner does), and derived afresh from every peer and prompt (a new
``Admission`` each time: the baseline, and what the learner did before).
``growth``: the kept view's cost at the largest N over the smallest (1.0:
the same at any size).

    python bench/admission_cost.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echo_learner.swarm.admission import Admission  # noqa: E402
from echo_learner.swarm.peers import Newcomers, PeerBook  # noqa: E402
from echo_learner.swarm.pool import PromptPool  # noqa: E402
from echo_learner.tasks.base import TaskPrompt  # noqa: E402
from echo_learner.verify.verifier import ACCEPTED  # noqa: E402

DEADLINE_S = 30.0
GROUP_SIZE = 4


def swarm(n: int) -> tuple[PromptPool, PeerBook, list[str]]:
    book = PeerBook(strikes_to_ban=100, strike_window_s=60, ban_s=60, max_peers=2 * n, quiet_after_s=DEADLINE_S)
    pool = PromptPool(
        lambda: (TaskPrompt("abc", "cba"), (1, 2, 3)),
        capacity=4 * n,
        assignment_timeout_s=DEADLINE_S,
        memory=20 * n,
        newcomers=Newcomers(book, DEADLINE_S),
    )
    pool.set_open(True, min_version=0)
    names = [f"peer{i}" for i in range(n)]
    for name in names:
        book.seen(name)
        pool.take(name, 2, 0)
        book.on_verdict(name, ACCEPTED, GROUP_SIZE, 12, 5.0, 4.0)
    return pool, book, names


def per_change_us(n: int, changes: int, *, kept: bool, seed: int) -> float:
    """Microseconds of one change and the view read after it."""

    async def run() -> float:
        pool, book, names = swarm(n)
        rng = random.Random(seed)
        admission = Admission(pool, book, within_s=DEADLINE_S, group_size=GROUP_SIZE)
        admission.view()
        start = time.process_time()
        for _ in range(changes):
            peer = rng.choice(names)
            book.seen(peer)
            pool.take(peer, 1, 0)
            if not kept:  # from every peer and prompt, as a learner starting now would
                admission = Admission(pool, book, within_s=DEADLINE_S, group_size=GROUP_SIZE)
                pool.changes.everything()
                book.changes.everything()
            admission.view()
        return (time.process_time() - start) / changes * 1e6

    return trio.run(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,100,300,1000", help="peers (N), comma-separated")
    parser.add_argument("--changes", type=int, default=2000, help="changes timed per size and way")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    levels = []
    for n in sizes:
        kept = per_change_us(n, args.changes, kept=True, seed=n)
        afresh = per_change_us(n, args.changes, kept=False, seed=n)
        levels.append(
            {"peers": n, "kept_us": round(kept, 1), "afresh_us": round(afresh, 1), "ratio": round(kept / afresh, 3)}
        )
        if not args.json:
            print(f"N={n}: kept {kept:.1f} us, afresh {afresh:.1f} us a change (x{kept / afresh:.3f})")
    result = {"levels": levels, "growth": round(levels[-1]["kept_us"] / levels[0]["kept_us"], 2)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"growth (N={sizes[-1]} / N={sizes[0]}): {result['growth']}")


if __name__ == "__main__":
    main()
