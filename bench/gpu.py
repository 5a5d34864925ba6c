"""Every GPU check in one call: the GPU tests, both backends against bare
loops, the GPU against the CPU, and honest GPU rollouts checked by a CPU learner.

In order, each part timed, one JSON object at the end:

  pytest         ``pytest -m gpu`` (tests/test_gpu.py): passed, failed, skipped
                 (or, with ``--pytest-logs DIR``, the summaries the GPU kit's
                 check.sh left there, when it ran them already)
  trials         each backend loads and decodes a tiny model on the device, in
                 a child process (echo_node/backend_trial.py, what a node does first)
  isolation      llama.cpp's load in a child process as it is, after
                 ``import torch``, and after torch has started CUDA: which of
                 them crash (issue 71: a llama.cpp load crashed on an H200
                 beside torch's CUDA)
  speed          a SmolLM2-135M-shaped Llama (random weights): the node's
                 ``generate`` over a bare loop (``node_over_bare``; torch: a plain
                 KV-cache loop with multinomial sampling; llama.cpp: llama_decode
                 with its own samplers, a context holding every row), at 8, 64
                 and 256 rows of 128 new tokens, groups of 16; the node's host
                 ms per step (llama.cpp, 64 rows); ``gpu_over_cpu`` at 64 rows
                 against the same backend on 2 CPU threads (16 new tokens
                 there: tokens/s compared); ``continuous_over_chunked``
                 (bench/decode_steps.py)
  rollouts       honest rollouts per backend and dtype on the device, each
                 batch checked against the CPU learner's recompute
                 (bench/gpu_rollouts.py): ``refused`` must be 0

torch runs in this process; llama.cpp only in children that never import
torch (bench/llama_child.py), as a llama.cpp node keeps them apart.

    python bench/gpu.py --json                        # on a GPU machine: at most 8 minutes
    python bench/gpu.py --device cpu --quick --json   # here: small sizes, a few minutes
    bash .gpu/check.sh 'python bench/gpu.py --pytest-logs $OUT --json > $OUT/gpu.json'   # ../shared/gpu/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from gpu_rollouts import CHILD, honest_rollouts  # noqa: E402
from policies import policies, reverse_trained  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from echo_node.backend_trial import LOG_PREFIX, random_llama, try_backend  # noqa: E402

# SmolLM2-135M's shape (its config), random weights: speed does not depend on them.
SMOLLM2_SHAPE = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "pad_token_id": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
QUICK_SHAPE = {**SMOLLM2_SHAPE, "vocab_size": 8192, "hidden_size": 256, "intermediate_size": 512}
QUICK_SHAPE |= {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
TARGETS = {"node_over_bare": 0.8, "gpu_over_cpu": 100.0, "continuous_over_chunked": 1.3}
PROMPT_TOKENS, GROUP = 16, 16


def run_pytest(timeout_s: float) -> dict:
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    except subprocess.TimeoutExpired:
        summary = f"timed out after {timeout_s:.0f} s"
    return {**counts(summary), "summary": summary, "seconds": round(time.monotonic() - started, 1)}


def pytest_logs(directory: Path) -> dict:
    """The summaries of the kit's runs (check.sh: pytest-torch.log, pytest-llama.log)."""
    found = {}
    for log in sorted(directory.glob("pytest-*.log")):
        lines = log.read_text().strip().splitlines()
        found[log.stem] = {**counts(lines[-1] if lines else ""), "summary": lines[-1] if lines else "empty"}
    total = {k: sum(f[k] for f in found.values()) for k in ("passed", "failed", "skipped", "errors")}
    return {**total, "logs": found}


def counts(summary: str) -> dict:
    got = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return {
        "passed": got.get("passed", 0),
        "failed": got.get("failed", 0),
        "skipped": got.get("skipped", 0),
        "errors": got.get("error", 0) + got.get("errors", 0),
    }


def isolation(device: str) -> dict:
    """llama.cpp's trial in a child: as a node runs it, and after torch has
    been imported or has started CUDA in that child first."""
    trial = f"import runpy, sys; sys.argv = ['trial', 'llama', 'f16', {device!r}]; "
    trial += "runpy.run_module('echo_node.backend_trial', run_name='__main__')"
    first = {
        "alone": "",
        "after_import_torch": "import torch; ",
        "after_torch_cuda": "import torch; torch.cuda.init(); torch.cuda.mem_get_info(); ",
    }
    out = {}
    for name, before in first.items():
        if "cuda" in before and device != "cuda":
            out[name] = "not run: no CUDA device"
            continue
        done = subprocess.run([sys.executable, "-c", before + trial], cwd=ROOT, capture_output=True, text=True)
        said = [line.removeprefix(LOG_PREFIX) for line in done.stderr.splitlines() if line.startswith(LOG_PREFIX)]
        what = "ok" if done.returncode == 0 else f"exit {done.returncode}"
        if done.returncode < 0:
            what = f"crashed ({signal.Signals(-done.returncode).name})"
        out[name] = f"{what}; last log line: {said[-1] if said else 'none'}"
    return out


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def bare_torch(model, prompts: list[tuple[int, ...]], group: int, new_tokens: int) -> float:
    """Tokens/s of a plain KV-cache loop over the same rows (``group`` per
    prompt): one forward per token, softmax sampling, nothing else."""
    device = model.device.type
    ids = torch.tensor([p for p in prompts for _ in range(group)], device=model.device)
    sync(device)
    started = time.perf_counter()
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]
    for step in range(new_tokens):
        token = torch.multinomial(torch.softmax(logits.float(), dim=-1), 1)
        if step + 1 < new_tokens:
            logits = model(input_ids=token, cache=cache, use_cache=True).logits[:, -1]
    sync(device)
    return ids.shape[0] * new_tokens / (time.perf_counter() - started)


def node_torch(backend, prompts, group: int, new_tokens: int) -> float:
    sync(backend.device.kind)
    started = time.perf_counter()
    groups = backend.generate(prompts, group, new_tokens, 1.0, ())
    return sum(len(s.tokens) for g in groups for s in g) / (time.perf_counter() - started)


def torch_speed(args, shape: dict, work_dir: Path) -> dict:
    import random

    from echo_node.backend_choice import choose
    from echo_node.backend_torch import TorchBackend
    from echo_node.device import cpu

    config_json, weights = random_llama(shape)
    rng = random.Random(0)

    def prompts(rows: int) -> tuple[list[tuple[int, ...]], int]:
        """``rows`` rows: prompts of ``PROMPT_TOKENS``, and their group size."""
        group = min(GROUP, rows)
        made = [
            tuple(rng.randrange(300, shape["vocab_size"]) for _ in range(PROMPT_TOKENS)) for _ in range(rows // group)
        ]
        return made, group

    node, _ = choose("torch", "auto", 0, work_dir, args.device)
    node.load(config_json, weights)
    out: dict = {"dtype": node.dtype, "device": node.device.name, "rows": {}}
    for rows in args.rows:
        batch, group = prompts(rows)
        node_torch(node, batch, group, 4), bare_torch(node.model, batch, group, 4)  # warmed up
        nodes, bares = [], []
        for _ in range(args.repeats):  # alternated, the best of each
            nodes.append(node_torch(node, batch, group, args.new_tokens))
            bares.append(bare_torch(node.model, batch, group, args.new_tokens))
        out["rows"][str(rows)] = {
            "node": round(max(nodes), 1),
            "bare": round(max(bares), 1),
            "node_over_bare": round(max(nodes) / max(bares), 3),
        }
    node.close()
    threads = torch.get_num_threads()
    on_cpu = TorchBackend(args.cpu_threads, cpu(), "f32")
    on_cpu.load(config_json, weights)
    batch, group = prompts(args.cpu_rows)
    node_torch(on_cpu, batch, group, 4)  # warmed up
    rate = max(node_torch(on_cpu, batch, group, args.cpu_new_tokens) for _ in range(args.repeats))
    on_cpu.close()
    torch.set_num_threads(threads)
    out["cpu"] = {"threads": args.cpu_threads, "rows": args.cpu_rows, "dtype": "f32", "tokens_per_s": round(rate, 1)}
    return out


def llama_speed(args, shape: dict, dtype: str, work_dir: Path) -> dict:
    job = {
        "kind": "speed",
        "config": shape,
        "dtype": dtype,
        "device": args.device,
        "rows": args.rows,
        "group": GROUP,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": args.new_tokens,
        "threads": 4 if args.device != "cpu" else 1,
        "cpu_threads": args.cpu_threads,
        "cpu_rows": args.cpu_rows,
        "cpu_new_tokens": args.cpu_new_tokens,
        "repeats": args.repeats,
    }
    path, answer = work_dir / f"speed-{dtype}.json", work_dir / f"speed-{dtype}-answer.json"
    path.write_text(json.dumps(job))
    done = subprocess.run([sys.executable, str(CHILD), str(path), str(answer)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(answer.read_text())


def timed(seconds: dict, name: str, run):
    """``run()``, its time kept in ``seconds[name]``."""
    started = time.monotonic()
    print(f"gpu bench: {name} ...", file=sys.stderr, flush=True)
    result = run()
    seconds[name] = round(time.monotonic() - started, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "mps", "cpu"), help="where the node generates")
    parser.add_argument("--quick", action="store_true", help="small sizes (a 4-layer model, 8 and 64 rows, 16 tokens)")
    parser.add_argument(
        "--pytest-logs", type=Path, help="read the GPU kit's pytest logs here instead of running pytest"
    )
    parser.add_argument("--rollouts", type=int, help="honest rollouts per backend and dtype (2,048; quick: 256)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.device != "cpu" and not (torch.cuda.is_available() or torch.backends.mps.is_available()):
        parser.error(f"torch sees no {args.device} device here: --device cpu --quick runs the checks on the CPU")
    shape = QUICK_SHAPE if args.quick else SMOLLM2_SHAPE
    args.rows = [8, 64] if args.quick else [8, 64, 256]
    args.new_tokens = 16 if args.quick else 128
    args.cpu_threads, args.cpu_rows, args.cpu_new_tokens = 2, 64, 16
    args.repeats = 2
    rollouts = args.rollouts or (256 if args.quick else 2048)
    started, seconds = time.monotonic(), {}
    out: dict = {"device": args.device, "quick": args.quick, "model": "quick" if args.quick else "smollm2-135m-shape"}
    out["machine"] = {
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
    }
    if args.pytest_logs:
        out["pytest"] = timed(seconds, "pytest", lambda: pytest_logs(args.pytest_logs))
    else:
        out["pytest"] = timed(seconds, "pytest", lambda: run_pytest(240))
    out["trials"] = timed(
        seconds,
        "trials",
        lambda: {b: try_backend(b, d, args.device).line for b, d in (("torch", "auto"), ("llama", "f16"))},
    )
    out["isolation"] = timed(seconds, "isolation", lambda: isolation(args.device))
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as work:
        work_dir = Path(work)
        speed = {"torch": timed(seconds, "speed torch", lambda: torch_speed(args, shape, work_dir))}
        for dtype in ("f16", "q8_0"):
            speed[f"llama-{dtype}"] = timed(
                seconds, f"speed llama {dtype}", lambda d=dtype: llama_speed(args, shape, d, work_dir)
            )
    models = list(policies(timed(seconds, "training the reverse policy", reverse_trained)))
    checked = {}
    for backend, dtype in (("torch", "f32"), ("torch", "auto"), ("llama", "f32"), ("llama", "f16"), ("llama", "q8_0")):
        checked[f"{backend}-{dtype}"] = timed(
            seconds,
            f"rollouts {backend}-{dtype}",
            lambda b=backend, d=dtype: honest_rollouts(b, d, args.device, models, rollouts),
        )
    out.update(summary(out, speed, checked))
    out["seconds"] = {**seconds, "total": round(time.monotonic() - started, 1)}
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


def summary(out: dict, speed: dict, checked: dict) -> dict:
    """The figures the issue's targets name, and whether each is met."""
    key = {"torch": f"torch-{speed['torch'].get('dtype', '?')}"}
    node_over_bare = {
        key.get(name, name): {r: v["node_over_bare"] for r, v in s.get("rows", {}).items()} for name, s in speed.items()
    }
    gpu_over_cpu = {}
    for name, s in speed.items():
        if "cpu" in s and "64" in s.get("rows", {}):
            gpu_over_cpu[key.get(name, name)] = round(s["rows"]["64"]["node"] / s["cpu"]["tokens_per_s"], 1)
    continuous = speed.get("llama-f16", {}).get("continuous", {})
    host = speed.get("llama-f16", {}).get("rows", {}).get("64", {}).get("host_ms_per_step")
    refused = sum(c["refused"] for c in checked.values())
    isolated = all(not s.get("torch_imported") for s in speed.values())
    met: dict | str = {
        "pytest": out["pytest"]["failed"] == 0 and out["pytest"]["errors"] == 0 and out["pytest"]["skipped"] == 0,
        "node_over_bare": all(
            r >= TARGETS["node_over_bare"] for rows in node_over_bare.values() for r in rows.values()
        ),
        "gpu_over_cpu": all(r >= TARGETS["gpu_over_cpu"] for r in gpu_over_cpu.values()),
        "continuous_over_chunked": continuous.get("continuous_over_chunked", 0) >= TARGETS["continuous_over_chunked"],
        "refused": refused == 0,
        "llama_without_torch": isolated,
    }
    if out["device"] == "cpu":
        met = "the targets are a GPU's (--device cuda)"
    return {
        "node_over_bare": node_over_bare,
        "gpu_over_cpu": gpu_over_cpu,
        "continuous_over_chunked": continuous.get("continuous_over_chunked"),
        "host_ms_per_step": host,
        "refused": refused,
        "rollouts": checked,
        "speed": speed,
        "targets": TARGETS,
        "met": met,
    }


if __name__ == "__main__":
    raise SystemExit(main())
