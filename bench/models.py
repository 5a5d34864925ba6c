"""Every model family on both backends, and a Qwen3-0.6B-shaped model in a real swarm.

Part (1), ``--only families``. For each family of ``protocol.models.families``
(the tiny random models of ``tests/families.py``, each with its family's
quirks), a llama.cpp node (f32 and q8_0) and a torch node (f32) generate
``--rollouts`` honest rollouts each, and every batch is verified exactly as
the learner verifies it (``logprob_error`` + ``check_logprobs`` with the
tolerance of the declared backend, dtype and family). A family is ok when
neither backend has a false reject.

Prints ``family_rollouts_checked`` and ``family_false_rejects`` per family
and backend, the worst |log-prob difference| seen, and ``families_ok``.

Part (2), ``--only qwen3``. A model of Qwen3-0.6B's real shape (28 layers,
hidden 1024, 16 heads / 8 KV heads, head_dim 128, vocab 151,936, tied
embeddings, q/k norms; random weights in bf16) trained with LoRA r16 by a
real learner, with a llama.cpp q8_0 node and a torch f32 node, real
processes on 127.0.0.1, short answers, until every node has ``--rollouts-per-node``
rollouts accepted over at least ``--versions`` adapter versions. Random
weights score 0 on every prompt, so training leaves the adapters as they
start: they start non-zero (``--lora-init-scale 0.01``), so that the q8_0
node's log-probs are checked against a policy its base alone is not. Prints
``base_bytes_per_param``, ``q8_base_bytes_per_param`` (the signed q8_0
GGUF the q8_0 node fetches in place of the base), ``adapter_over_base``,
``rollouts_checked`` and
``false_rejects`` per node, ``join_to_first_accepted_s``,
``node_tokens_per_s``, ``memory_estimate_error`` (|what the node's memory
model says its peak is - its peak RSS| / peak RSS), ``node_peak_rss_gib``, ``learner_peak_rss_gib``,
``learner_step_s`` (between published steps) and ``learner_train_step_s``
(one LoRA step on the same batch shape with rewards that differ: random
weights score 0 everywhere, so the swarm's own steps skip training).

    python bench/models.py --json              # both parts: ~1 minute + ~30 minutes
    python bench/models.py --only families --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

from harness import read_ledger  # noqa: E402
from localswarm import local_swarm  # noqa: E402
from plausibility import EOS, GROUP, PAD, as_batch, backend_for, prompts_for  # noqa: E402

from echo_learner.training.lora import state_bytes  # noqa: E402
from echo_learner.training.model import config_json  # noqa: E402
from echo_learner.verify.recompute import logprob_error  # noqa: E402
from echo_learner.verify.tolerance import tolerance  # noqa: E402
from echo_learner.verify.verifier import check_logprobs  # noqa: E402
from protocol import codec  # noqa: E402
from protocol.messages import Manifest  # noqa: E402
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


# Qwen3-0.6B's config.json, but for the tokenizer's ids (the built-in byte
# tokenizer's pad, bos and eos: prompts are the reverse task's bytes).
QWEN3_0_6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    pad_token_id=256,
    bos_token_id=257,
    eos_token_id=258,
)
NODES = (("torch", "f32"), ("llama", "q8_0"))


def save_qwen3_0_6b(directory: Path) -> int:
    """A random-weight Qwen3-0.6B-shaped model in bf16 as a Hugging Face directory; its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from echo_learner.training.model import build_tokenizer

    config = AutoConfig.for_model("qwen3", **QWEN3_0_6B, dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def peak_rss_gib(pid: int) -> float:
    """A live process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    raise ValueError(f"no VmHWM for {pid}")


def node_estimate_gib(
    config_json: str, backend: str, dtype: str, sequences: int, new_tokens: int, variant: str = ""
) -> float:
    """What the node's memory model (echo_node/memory.py) says its peak is:
    loading a LoRA version beside the one in use (torch keeps that one as its
    spare; llama.cpp loads its base once, from ``variant`` if it fetched
    one), one generate call, and the headroom it keeps for its own Python heap."""
    from echo_node.backend_choice import spec_of
    from echo_node.memory import HEADROOM, WEIGHT_BYTES, call_need, load_need
    from echo_node.model_shape import model_shape

    shape, spec = model_shape(config_json), spec_of(backend)
    # A backend that merges adapters builds the next version beside the one in use.
    in_use = shape.parameters * WEIGHT_BYTES[dtype] if spec.merges_lora else 0
    need = load_need(shape, spec, dtype, variant=variant, lora=True) + call_need(shape, spec, sequences, 16, new_tokens)
    return (in_use + need.total + HEADROOM) / 2**30


def verdicts(ledger: Path) -> list[tuple]:
    if not ledger.exists():
        return []
    return read_ledger(ledger, "SELECT peer, version, rollouts, verdict, reason, created_ms FROM verdicts")


def train_step_s(model_dir: Path, max_new_tokens: int, steps: int = 3) -> float:
    """The learner's LoRA r16 training step on the swarm's batch shape (4
    prompts x 4 completions), with rewards that differ (the swarm's random
    model scores 0 everywhere, so the swarm's steps never train): median
    seconds, in this process with one thread as the swarm's learner."""
    import torch

    from echo_learner.training.lora import LoraSettings, wrap
    from echo_learner.training.model import load_model
    from echo_learner.training.trainer import Objective, ScoredGroup, Trainer

    torch.set_num_threads(1)
    model, _ = load_model(str(model_dir))
    model = wrap(
        model,
        LoraSettings(16, 32.0, 0.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    )
    trainer = Trainer(model, lr=2e-4, objective=Objective(0.2, 3.0, 0.0), pad_id=PAD)
    rng = random.Random(0)
    groups = [
        ScoredGroup(
            prompt_tokens=(257, *(rng.randrange(97, 101) for _ in range(3)), 61),
            completions=tuple(tuple(rng.randrange(97, 101) for _ in range(max_new_tokens)) for _ in range(4)),
            behaviour_logprobs=tuple(tuple(-1.0 for _ in range(max_new_tokens)) for _ in range(4)),
            rewards=(0.0, 1.0, 0.5, 0.0),
        )
        for _ in range(4)
    ]
    times = []
    for _ in range(steps):
        started = time.monotonic()
        assert trainer.step(groups).tokens > 0
        times.append(time.monotonic() - started)
    return statistics.median(times)


def run_qwen3(args: argparse.Namespace, root: Path) -> dict:
    model_dir = root / "qwen3-0.6b"
    params = save_qwen3_0_6b(model_dir)
    verbose = ("-v",) if args.verbose else ()
    with local_swarm(root / "swarm") as swarm:
        swarm.start_bootstrap()
        learner = swarm.start_learner(
            "--model", str(model_dir), "--lora", "16", "--lr", "2e-4", "--steps", "1000000", "--lora-init-scale", "0.01",
            "--group-size", "4", "--prompts-per-step", "4", "--max-new-tokens", str(args.max_new_tokens),
            "--torch-threads", "1", *verbose,
        )  # fmt: skip
        started = {}
        for i, (backend, dtype) in enumerate(NODES):
            started[i] = time.time()
            swarm.start_node(i, "--backend", backend, "--dtype", dtype, "--threads", "1", *verbose)
        ledger = swarm.root / "learner" / "ledger.sqlite"
        deadline = time.monotonic() + args.timeout_min * 60
        reached = False
        while not reached and time.monotonic() < deadline:
            for name, proc in swarm.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}; see {swarm.root / name}.log")
            rows = verdicts(ledger)
            accepted: dict[str, int] = {}
            for peer, _version, rollouts, verdict, _reason, _ms in rows:
                if verdict == "accepted":
                    accepted[peer] = accepted.get(peer, 0) + rollouts
            reached = (
                len(accepted) == len(NODES)
                and min(accepted.values()) >= args.rollouts_per_node
                and len(swarm.metrics()) >= args.versions
            )
            if not reached:
                time.sleep(5)  # polling another process's SQLite file
        peers = {
            p["peer"]: p
            for p in json.loads(
                swarm.run(
                    "learner", "echo_learner", "peers", "--json", "--data-dir", str(swarm.root / "learner")
                ).stdout
            )
        }
        rss = {"learner": peak_rss_gib(learner.pid)}
        for i in range(len(NODES)):
            rss[f"node{i}"] = peak_rss_gib(swarm.procs[f"node{i}"].pid)
        rows = verdicts(ledger)
        steps = swarm.metrics()
        manifests = [
            codec.decode(p.read_bytes(), Manifest) for p in (swarm.root / "learner" / "weights").glob("*/manifests/*")
        ]
        variants = [
            codec.decode(p.read_bytes(), Manifest)
            for p in (swarm.root / "learner" / "weights").glob("*/variants/manifests/*")
        ]
        # The form each node fetched the base in (its store's version 0).
        held = {
            i: codec.decode(path.read_bytes(), Manifest).format
            for i in range(len(NODES))
            for path in (swarm.root / f"node{i}" / "weights").glob("*/manifests/0.msgpack")
        }
        codes = swarm.stop_all()
    base = next(m for m in manifests if m.format == "safetensors")
    q8_base = next((m for m in variants if m.format == "gguf_q8_0"), None)
    adapters = [m.total_size for m in manifests if m.format == "lora"]
    per_node = {}
    for i, (backend, dtype) in enumerate(NODES):
        name = f"{backend}_{dtype}"
        peer = next((p for p in peers.values() if p["backend"] == backend), None)
        mine = [r for r in rows if peer is not None and r[0] == peer["peer"]]
        first = min((r[5] for r in mine if r[3] == "accepted"), default=None)
        variant = "gguf_q8_0" if held.get(i) == "gguf_q8_0" else ""
        estimate = node_estimate_gib(base.model_config, backend, dtype, 4 * 4, args.max_new_tokens, variant)
        per_node[name] = {
            "base_fetched_as": held.get(i),
            "rollouts_checked": sum(r[2] for r in mine),
            "false_rejects": sum(r[2] for r in mine if r[3] == "refused" and r[4] != "version_out_of_window"),
            "out_of_window": sum(r[2] for r in mine if r[4] == "version_out_of_window"),
            "join_to_first_accepted_s": None if first is None else round(first / 1000 - started[i], 1),
            "node_tokens_per_s": None if peer is None else peer["tokens_per_s"],
            "memory_estimate_gib": round(estimate, 2),
            "node_peak_rss_gib": round(rss[f"node{i}"], 2),
            "memory_estimate_error": round(abs(estimate - rss[f"node{i}"]) / rss[f"node{i}"], 3),
        }
    step_times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps, steps[1:])]
    train_s = train_step_s(model_dir, args.max_new_tokens)
    return {
        "params": params,
        "base_bytes_per_param": round(base.total_size / params, 3),
        "q8_base_bytes_per_param": round(q8_base.total_size / params, 3) if q8_base else None,
        "adapter_over_base": round(max(adapters) / base.total_size, 4) if adapters else None,
        "targets_reached": reached,  # rollouts per node and versions, before --timeout-min
        "versions": len(steps),
        "nodes": per_node,
        "learner_peak_rss_gib": round(rss["learner"], 2),
        "learner_step_s": round(statistics.median(step_times), 2) if step_times else None,
        "learner_train_step_s": round(train_s, 2),
        "exit_codes": codes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000, help="honest rollouts per family and backend")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("families", "qwen3"), help="run one part (default: both)")
    parser.add_argument("--rollouts-per-node", type=int, default=256, help="part 2: accepted rollouts per node")
    parser.add_argument("--versions", type=int, default=6, help="part 2: at least this many versions")
    parser.add_argument("--timeout-min", type=float, default=45, help="part 2: give up after this long")
    parser.add_argument("--dir", type=Path, help="part 2: keep the swarm's files here (default: a temporary dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("-v", "--verbose", action="store_true", help="part 2: the processes log in detail")
    args = parser.parse_args()
    started = time.monotonic()
    result: dict = {}
    if args.only != "qwen3":
        result.update(run_families(args))
    if args.only != "families":
        if args.dir is not None:
            args.dir.mkdir(parents=True, exist_ok=True)
            result["qwen3_0_6b"] = run_qwen3(args, args.dir)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                result["qwen3_0_6b"] = run_qwen3(args, Path(tmp))
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))


def run_families(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    families = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            families[family] = check_family(family, args.rollouts, args.max_new_tokens, rng, Path(tmp))
            if not args.json:
                print(family, json.dumps(families[family]), flush=True)
    return {
        "family_rollouts_checked": {f: {b: r["rollouts_checked"] for b, r in v.items()} for f, v in families.items()},
        "family_false_rejects": {f: {b: r["false_rejects"] for b, r in v.items()} for f, v in families.items()},
        "family_worst_logprob_diff": {
            f: {b: r["worst_logprob_diff"] for b, r in v.items()} for f, v in families.items()
        },
        "families_ok": sorted(f for f, v in families.items() if all(r["false_rejects"] == 0 for r in v.values())),
    }


if __name__ == "__main__":
    main()
