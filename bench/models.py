"""Every model family on both backends, checked as the learner checks rollouts.

Part (1) of issue 36's benchmark. For each family of ``protocol.families``
(the tiny random models of ``tests/families.py``, each with its family's
quirks), a llama.cpp node (f32 and q8_0) and a torch node (f32) generate
``--rollouts`` honest rollouts each, and every batch is verified exactly as
the learner verifies it (``logprob_error`` + ``check_logprobs`` with the
tolerance of the declared backend, dtype and family). A family is ok when
neither backend has a false reject.

    python bench/models.py --json              # >= 2,000 rollouts per family and backend, ~2 minutes

Prints ``family_rollouts_checked`` and ``family_false_rejects`` per family
and backend, the worst |log-prob difference| seen, and ``families_ok``.
Part (2), the Qwen3-0.6B-shaped swarm, is not built yet.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from plausibility import EOS, GROUP, PAD, as_batch, backend_for, prompts_for  # noqa: E402

from echo_learner.lora import state_bytes  # noqa: E402
from echo_learner.model import config_json  # noqa: E402
from echo_learner.tolerance import tolerance  # noqa: E402
from echo_learner.verify import check_logprobs, logprob_error  # noqa: E402
from tests.families import FAMILIES, tiny_model  # noqa: E402

BACKENDS = (("llama", "f32"), ("llama", "q8_0"), ("torch", "f32"))


def check_family(family: str, rollouts: int, max_new: int, rng: random.Random, work_dir: Path) -> dict:
    model = tiny_model(family)
    out = {}
    for name, dtype in BACKENDS:
        backend = backend_for(name, dtype, "cpu", work_dir / family)
        backend.load(config_json(model), state_bytes(model))
        allowed = tolerance(name, dtype, "cpu", family)
        done, false_rejects, worst = 0, 0, 0.0
        while done < rollouts:
            prompts = prompts_for(rng)
            groups = backend.generate(prompts, GROUP, max_new, 1.0, (EOS,))
            batch = as_batch(name, dtype, [[(s.tokens, tuple(s.logprobs)) for s in g] for g in groups])
            error = logprob_error(model, prompts, batch, PAD)
            false_rejects += check_logprobs(error, allowed) is not None
            worst = max(worst, error.worst)
            done += sum(len(g) for g in groups)
        backend.close()
        out[f"{name}_{dtype}"] = {
            "rollouts_checked": done,
            "false_rejects": false_rejects,
            "worst_logprob_diff": round(worst, 6),
            "allowed_worst": allowed.worst,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000, help="honest rollouts per family and backend")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()
    started = time.monotonic()
    rng = random.Random(args.seed)
    families = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            families[family] = check_family(family, args.rollouts, args.max_new_tokens, rng, Path(tmp))
            if not args.json:
                print(family, json.dumps(families[family]), flush=True)
    result = {
        "family_rollouts_checked": {f: {b: r["rollouts_checked"] for b, r in v.items()} for f, v in families.items()},
        "family_false_rejects": {f: {b: r["false_rejects"] for b, r in v.items()} for f, v in families.items()},
        "family_worst_logprob_diff": {
            f: {b: r["worst_logprob_diff"] for b, r in v.items()} for f, v in families.items()
        },
        "families_ok": sorted(f for f, v in families.items() if all(r["false_rejects"] == 0 for r in v.values())),
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
