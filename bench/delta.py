"""Update benchmark: versions shipped as LoRA adapters and full-weight deltas
against a base, broadcast to real node processes at capped uplinks.

1. Training (this process): SmolLM2-135M-Instruct learns two-term sums with
   real GRPO steps (completions sampled from the policy, rewarded by the task).
   v0 is the model itself (the base, full weights); v1..vN are LoRA versions
   (rank 16 on the attention and MLP projections), each published as its
   adapter against v0; then a second run trains every weight from the same v0
   and publishes its first M versions as XOR deltas against v0. Both runs go
   through the learner's own ``Publisher`` into a version store signed with
   the seed's key.
2. Broadcast: a seed (bench/broadcast_peer.py) serves those versions one at a
   time to ``--nodes`` nodes, every process capped at ``--upload-mbit``. Each
   node reports when a version is usable (its base held too) and whether every
   signed digest checks: the base, the adapter, a delta's rebuilt file.

``update_broadcast_s`` and ``full_broadcast_s`` are the time from the seed's
announcement until the last node holds the version; ratios compare them
within this run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))

from harness import print_result  # noqa: E402
from localswarm import local_swarm  # noqa: E402
from swarmproc import Peer, keep_logs, wait_until  # noqa: E402

TASK = "math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def grpo_versions(store, identity, args) -> dict:
    """Train and stage v0 (base), LoRA versions, then full-weight delta versions."""
    import torch

    from echo_learner.swarm.publishing import JobManifestFields, Publisher
    from echo_learner.tasks.registry import load_task
    from echo_learner.training.logprobs import completion_logprobs
    from echo_learner.training.lora import LoraSettings, state_bytes, wrap
    from echo_learner.training.model import config_json, load_model, render_prompt, stop_ids, tokenizer_digest
    from echo_learner.training.trainer import Objective, ScoredGroup, Trainer

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    task = load_task(TASK)
    rng = random.Random(args.seed)

    def publisher(model, tok, lora=None, frozen=None):
        return Publisher(
            identity,
            JobManifestFields(
                job_id="bench-delta",
                task=TASK,
                model_config=config_json(model),
                tokenizer_digest=tokenizer_digest(tok),
                chunk_size=args.chunk_kib * 1024,
            ),
            max_update_ratio=1.0,
            lora=lora,
            frozen_base=frozen,
        )

    def stage(m, chunks) -> None:
        store.add_manifest(m)
        for i, c in enumerate(chunks):
            store.write(m.version, i, c)

    def step(trainer, model, tok) -> float:
        """One GRPO step on freshly sampled groups that teach something; their mean reward."""
        groups = []
        stops = list(stop_ids(tok))
        while len(groups) < args.prompts:
            prompt = task.sample(rng)
            ids = render_prompt(tok, prompt.text, task.system_prompt)
            with torch.no_grad():
                out = model.generate(
                    input_ids=torch.tensor([ids]),
                    do_sample=True,
                    temperature=0.7,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=args.max_new_tokens,
                    num_return_sequences=args.group,
                    eos_token_id=stops,
                    pad_token_id=tok.pad_token_id,
                )
            completions = []
            for row in out[:, len(ids) :].tolist():
                cut = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
                completions.append(tuple(row[:cut]))
            rewards = tuple(task.reward(prompt, tok.decode(c, skip_special_tokens=True)) for c in completions)
            with torch.no_grad():
                lp, mask = completion_logprobs(model, [ids] * len(completions), completions, tok.pad_token_id, 0.7)
            behaviour = tuple(tuple(row[m.bool()].tolist()) for row, m in zip(lp, mask))
            if len(set(rewards)) > 1:  # a group all right or all wrong teaches nothing: the next prompt
                groups.append(ScoredGroup(tuple(ids), tuple(completions), behaviour, rewards))
        trainer.step(groups)
        return statistics.mean(r for g in groups for r in g.rewards)

    def objective():
        return Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.0)

    model, tok = load_model("smollm2")
    frozen = state_bytes(model)
    lora = LoraSettings(rank=args.rank, alpha=2.0 * args.rank, dropout=0.0, targets=TARGETS)
    pub = publisher(model, tok, lora, frozen)
    stage(*pub.build_base(0))
    peft_model = wrap(model, lora)
    trainer = Trainer(peft_model, lr=args.lora_lr, objective=objective(), pad_id=tok.pad_token_id, temperature=0.7)
    rewards = {"lora": [], "full": []}
    for version in range(1, args.versions + 1):
        t0 = time.monotonic()
        rewards["lora"].append(step(trainer, peft_model, tok))
        stage(*pub.build(version, peft_model))
        progress(f"lora v{version}: reward {rewards['lora'][-1]:.2f}, {time.monotonic() - t0:.1f} s")

    model, tok = load_model("smollm2")  # the same v0, trained in full this time
    full_pub = publisher(model, tok)
    full_pub.base = (store.manifests[0], frozen)
    trainer = Trainer(model, lr=args.full_lr, objective=objective(), pad_id=tok.pad_token_id, temperature=0.7)
    for i in range(1, args.full_versions + 1):
        version = args.versions + i
        t0 = time.monotonic()
        rewards["full"].append(step(trainer, model, tok))
        stage(*full_pub.build(version, model))
        progress(f"full v{version}: reward {rewards['full'][-1]:.2f}, {time.monotonic() - t0:.1f} s")
    return rewards


def release_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def broadcast(root: Path, bootstrap: str, seed_dir: Path, staged: Path, versions: list[int], args) -> dict[int, dict]:
    """Publish ``versions`` one at a time; per version the seconds until every node holds it."""
    common = [
        "--bootstrap",
        bootstrap,
        "--job-id",
        "bench-delta",
        "--upload-mbit",
        str(args.upload_mbit),
        "--chunk-kib",
        str(args.chunk_kib),
        "--keep",
        "2",
        "--request-timeout-s",
        "30",
    ]
    seed = Peer("seed", ["--role", "seed", "--data-dir", str(seed_dir), "--staged", str(staged), *common], root)
    peers = [seed]
    try:
        wait_until([seed], lambda: seed.last("ready") is not None, 60)
        learner_id = seed.last("ready")["peer"]
        nodes = [
            Peer(
                f"node{i}",
                ["--role", "node", "--data-dir", str(root / f"node{i}"), "--learner-id", learner_id, *common],
                root,
            )
            for i in range(args.nodes)
        ]
        peers += nodes
        want = min(args.nodes, 16)
        wait_until(peers, lambda: all((n.last("neighbours") or {}).get("n", 0) >= want for n in nodes), 120)
        results = {}
        for version in versions:
            seed.send("publish")

            def done(v=version) -> bool:
                return all(any(e["event"] == "complete" and e["version"] == v for e in n.events) for n in nodes)

            wait_until(peers, done, args.timeout_s)
            t0 = next(e["t"] for e in seed.events if e["event"] == "published" and e["version"] == version)
            ends = [next(e for e in n.events if e["event"] == "complete" and e["version"] == version) for n in nodes]
            results[version] = {"s": max(e["t"] for e in ends) - t0, "exact": sum(e["exact"] for e in ends)}
            progress(f"broadcast v{version}: {results[version]['s']:.1f} s, {results[version]['exact']} exact")
        return results
    finally:
        for p in peers:
            p.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--upload-mbit", type=float, default=20)
    parser.add_argument("--versions", type=int, default=10, help="LoRA versions after the base")
    parser.add_argument(
        "--full-versions",
        type=int,
        default=2,
        help="full-weight delta versions (each takes minutes to broadcast at 20 Mbit/s)",
    )
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lora-lr", type=float, default=2e-4)
    parser.add_argument("--full-lr", type=float, default=3e-5)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per GRPO step")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--chunk-kib", type=int, default=512)
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy process logs here")
    args = parser.parse_args()

    from protocol.broadcast.store import VersionStore
    from protocol.identity import load_or_create

    root = Path(tempfile.mkdtemp(prefix="echo-delta-"))
    try:
        identity = load_or_create(root / "seed" / "identity.key")
        staged = root / "staged"
        store = VersionStore(staged, learner_id=identity.peer_id_str, keep=10**6)
        t0 = time.monotonic()
        rewards = grpo_versions(store, identity, args)
        train_s = time.monotonic() - t0
        release_memory()  # the models and optimisers: 8 nodes rebuilding 538 MB each need the room
        sizes = {v: m.total_size for v, m in store.manifests.items()}
        formats = {v: m.format for v, m in store.manifests.items()}
        lora_vs = [v for v in sorted(sizes) if formats[v] == "lora"]
        delta_vs = [v for v in sorted(sizes) if formats[v] == "delta"]
        with local_swarm(root / "swarm") as swarm:
            timed = broadcast(root / "swarm", swarm.start_bootstrap(), root / "seed", staged, sorted(sizes), args)
    finally:
        keep_logs(root, args.keep_logs)
        shutil.rmtree(root, ignore_errors=True)

    full = sizes[0]

    def mean(vs, key):
        return statistics.mean(timed[v][key] for v in vs)

    result = {
        "model": "SmolLM2-135M-Instruct",
        "nodes": args.nodes,
        "upload_mbit": args.upload_mbit,
        "rank": args.rank,
        "versions": len(lora_vs),
        "full_bytes": full,
        "update_bytes_mean": round(statistics.mean(sizes[v] for v in lora_vs)),
        "update_over_full": round(statistics.mean(sizes[v] for v in lora_vs) / full, 4),
        "nodes_exact": min(timed[v]["exact"] for v in timed),
        "full_broadcast_s": round(timed[0]["s"], 1),
        "update_broadcast_s": round(mean(lora_vs, "s"), 2),
        "update_over_full_broadcast": round(mean(lora_vs, "s") / timed[0]["s"], 4),
        "bound_full_s": round(full * 8 / (args.upload_mbit * 1e6), 1),
        "full_delta": {
            "versions": len(delta_vs),
            "update_bytes_mean": round(statistics.mean(sizes[v] for v in delta_vs)) if delta_vs else None,
            "update_over_full": round(statistics.mean(sizes[v] for v in delta_vs) / full, 4) if delta_vs else None,
            "update_broadcast_s": round(mean(delta_vs, "s"), 2) if delta_vs else None,
            "update_over_full_broadcast": round(mean(delta_vs, "s") / timed[0]["s"], 4) if delta_vs else None,
        },
        "per_version": {
            v: {"format": formats[v], "bytes": sizes[v], "s": round(timed[v]["s"], 2), "exact": timed[v]["exact"]}
            for v in sorted(timed)
        },
        "reward": rewards,
        "train_s": round(train_s, 1),
    }
    print_result(result, args.json)


if __name__ == "__main__":
    main()
