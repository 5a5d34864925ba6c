"""Echo Swarm against TRL's GRPOTrainer: the same job, one after the other, on this machine.

Both start from SmolLM2-135M-Instruct as the project loads it (``--model
smollm2``) and train on the same task, with our reward function (handed to
TRL as its reward function), the same training prompts in the same order,
group size, prompts per step, answer budget, temperature, learning rate,
optimizer (AdamW, constant rate, gradient norm clipped at 1), KL weight (0)
and loss (TRL's default ``dapo``; ours equals it, tests/learner/test_vs_trl.py):

1. TRL's ``GRPOTrainer``, generating with transformers, torch on --threads
   threads, in a process of its own;
2. Echo Swarm: the learner and one llama.cpp node, each pinned to a core of
   its own (a volunteer's machine is separate), sync mode, so that every
   step trains on completions of the current weights, as TRL's do.

The start, the middle and the end of each run are scored by ``echo-learner
eval`` on the same --heldout-n held-out prompts (greedy). Operator CPU:
ours is the learner process alone (the nodes are the volunteers'); TRL's its
whole process. Ours is split by phase from the learner's ``/api/status``
(``load``: CPU ms per accepted batch of one group) and its step timings.

    python bench/vs_trl.py --json                       # 40 steps, seeds 0 and 1: about 3 hours on 2 cores
    python bench/vs_trl.py --steps 4 --seeds 0 --heldout-n 16 --json   # a smoke run, ~6 minutes

Needs the ``[compare]`` extra (``pip install -e '.[compare]'``: trl, matplotlib).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from xml.etree import ElementTree

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from localswarm import SwarmError, local_swarm  # noqa: E402

# bench/learning.py's task: the base model solves ~0.3 of it (docs/tasks.md).
TASK = "math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
LEARNER_CPU, NODE_CPU = {0}, {1}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """What both trainers are given."""

    task: str = TASK
    steps: int = 40
    seed: int = 0
    group_size: int = 8
    prompts_per_step: int = 4
    max_new_tokens: int = 64
    temperature: float = 0.7
    lr: float = 3e-5
    kl_coef: float = 0.0
    loss_type: str = "dapo"
    threads: int = 2  # TRL's torch threads

    @property
    def middle(self) -> int:
        return self.steps // 2


def training_prompts(job: Job) -> list:
    """The prompts our learner draws, in its order: ``task.sample`` on
    ``random.Random(seed)`` (echo_learner/service.py, ``_new_prompt``)."""
    import random

    from echo_learner.tasks.registry import load_task

    task = load_task(job.task)
    rng = random.Random(job.seed)
    return [task.sample(rng) for _ in range(job.steps * job.prompts_per_step)]


# --- TRL ----------------------------------------------------------------------


def trl_worker(job: Job, out: Path) -> None:
    """Train with TRL's GRPOTrainer (this process is the one measured); save
    the weights at the middle and the end; write ``trl.json``."""
    import torch

    torch.set_num_threads(job.threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from echo_learner.tasks.registry import load_task
    from echo_learner.training.model import load_model, render_prompt, smollm2_path

    started_cpu, started = time.process_time(), time.monotonic()
    task = load_task(job.task)
    train = training_prompts(job)
    model, tokenizer = load_model("smollm2", job.seed)
    system = task.system_prompt

    def messages(text: str) -> list[dict]:
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]

    # TRL renders the chat itself: check that it reads the prompt as our learner does.
    rendered = tokenizer.apply_chat_template(
        messages(train[0].text), add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    if tuple(rendered) != render_prompt(tokenizer, train[0].text, system):
        raise SystemExit("TRL would render the prompts differently from the learner")

    def reward(prompts, completions, index, **kwargs) -> list[float]:
        return [task.reward(train[i], c[-1]["content"]) for i, c in zip(index, completions)]

    dataset = Dataset.from_list([{"prompt": messages(p.text), "index": i} for i, p in enumerate(train)])
    args = GRPOConfig(
        output_dir=str(out / "trl-run"),
        max_steps=job.steps,
        per_device_train_batch_size=job.group_size * job.prompts_per_step,
        num_generations=job.group_size,
        max_completion_length=job.max_new_tokens,
        temperature=job.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=job.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",  # its default; ours is fused too
        beta=job.kl_coef,
        loss_type=job.loss_type,
        delta=3.0,  # our --ratio-cap (on-policy here: ratio 1, no effect)
        shuffle_dataset=False,
        seed=job.seed,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        gradient_checkpointing=False,  # TRL turns it on to save GPU memory; on this CPU it only costs time
    )
    steps: list[dict] = []
    saved_cpu = 0.0

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            nonlocal saved_cpu
            steps.append({"step": state.global_step, "elapsed_s": round(time.monotonic() - started, 2)})
            if state.global_step in (job.middle, job.steps):
                before = time.process_time()
                where = out / f"trl-step{state.global_step}"
                model.config.use_cache = True  # TRL turns it off to train; scoring generates
                model.save_pretrained(where)
                tokenizer.save_pretrained(where)
                saved_cpu += time.process_time() - before  # scoring's, not training's

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Record()],
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    for record, r in zip(steps, rewards):
        record["reward_mean"] = r
    result = {
        "cpu_s": round(time.process_time() - started_cpu - saved_cpu, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "steps": steps,
        "source": str(smollm2_path()),
    }
    (out / "trl.json").write_text(json.dumps(result))


def run_trl(job: Job, out: Path) -> dict:
    log = open(out / "trl.log", "w")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, __file__, "--trl-worker", json.dumps(dataclasses.asdict(job)), "--dir", str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise SwarmError(f"TRL failed ({proc.returncode}); see {out}/trl.log")
    result = json.loads((out / "trl.json").read_text())
    result["process_wall_s"] = round(time.monotonic() - started, 1)
    return result


# --- Echo Swarm ---------------------------------------------------------------


def api_status(data_dir: Path) -> dict | None:
    try:
        url = json.loads((data_dir / "api.json").read_text())["url"].split("#", 1)[0]
        with urllib.request.urlopen(url + "api/status", timeout=5) as reply:
            return json.load(reply)
    except (OSError, ValueError, KeyError):
        return None


def run_echo(job: Job, out: Path) -> dict:
    """The learner and one llama.cpp node until the learner has made
    ``job.steps`` steps and stopped; its CPU time and phase split as it went."""
    data = out / "learner"
    started = time.monotonic()
    with local_swarm(out) as swarm:
        swarm.cpus = {"learner": LEARNER_CPU, "node0": NODE_CPU, "bootstrap": NODE_CPU}
        swarm.start_bootstrap()
        learner = swarm.start_learner(
            *("--model", "smollm2", "--task", job.task, "--mode", "sync", "--steps", str(job.steps)),
            *("--seed", str(job.seed), "--lr", str(job.lr), "--temperature", str(job.temperature)),
            *("--group-size", str(job.group_size), "--prompts-per-step", str(job.prompts_per_step)),
            *("--prompts-per-request", str(job.prompts_per_step), "--max-new-tokens", str(job.max_new_tokens)),
            *("--kl-coef", str(job.kl_coef), "--loss-type", job.loss_type, "--torch-threads", "1"),
            *("--eval-every", "0", "--checkpoint-every", str(job.middle)),
        )
        swarm.start_node(0, "--backend", "llama", "--threads", "1")
        process = psutil.Process(learner.pid)
        cpu_s, status, middle_copied = 0.0, None, False
        while learner.poll() is None:
            try:
                times = process.cpu_times()
                cpu_s = times.user + times.system
            except psutil.NoSuchProcess:
                break
            status = api_status(data) or status
            checkpoint = data / "checkpoint.pt"
            if not middle_copied and checkpoint.exists():
                middle = out / "echo-middle"
                middle.mkdir(exist_ok=True)
                shutil.copy(data / "config.json", middle / "config.json")
                shutil.copy(checkpoint, middle / "checkpoint.pt")
                middle_copied = True
            time.sleep(1)  # polling other processes' files and CPU counters: no event to await
        if learner.returncode != 0:
            raise SwarmError(f"learner exited with {learner.returncode}; see {out}/learner.log")
    metrics = swarm.metrics()
    return {
        "cpu_s": round(cpu_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "steps": [
            {"step": m["step"] + 1, "elapsed_s": m["elapsed_s"], "reward_mean": m["reward_mean"]} for m in metrics
        ],
        "load": (status or {}).get("load"),
        "measurements": (status or {}).get("measurements"),
        "rollouts_accepted": metrics[-1]["rollouts_accepted"] if metrics else 0,
    }


# --- scoring and the report ---------------------------------------------------


def evaluate(job: Job, n: int, *, data_dir: Path | None = None, model: str = "smollm2") -> dict:
    """``echo-learner eval`` (greedy, ``n`` held-out prompts) on a learner's
    checkpoint (``data_dir``) or a model directory."""
    cmd = [sys.executable, "-m", "echo_learner", "eval", "-n", str(n), "-k", "0", "--json", "--task", job.task]
    cmd += ["--max-new-tokens", str(job.max_new_tokens), "--model", model]
    if data_dir is None:
        cmd += ["--base", "--data-dir", "/nonexistent"]
    else:
        cmd += ["--data-dir", str(data_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SwarmError(f"eval failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    greedy = json.loads(out.stdout.strip().splitlines()[-1])["greedy"]
    return {"value": greedy["value"], "ci95": greedy["ci95"]}


def per_completion(cpu_s: float, job: Job) -> float:
    return round(cpu_s / (job.steps * job.prompts_per_step * job.group_size), 4)


def one_seed(job: Job, root: Path, heldout_n: int, start: dict, trl_from: Path | None) -> dict:
    out = root / f"seed{job.seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if trl_from is None:
        print(f"seed {job.seed}: TRL", file=sys.stderr, flush=True)
        trl = run_trl(job, out)
    else:  # an earlier run's TRL side, on this machine, with the same job
        for name in ("trl.json", "trl.log", f"trl-step{job.middle}", f"trl-step{job.steps}"):
            source = trl_from / f"seed{job.seed}" / name
            (shutil.copytree if source.is_dir() else shutil.copy)(source, out / name)
        trl = json.loads((out / "trl.json").read_text()) | {"reused_from": str(trl_from)}
    print(f"seed {job.seed}: Echo Swarm", file=sys.stderr, flush=True)
    echo = run_echo(job, out)
    (out / "echo.json").write_text(json.dumps(echo))  # kept should scoring fail
    print(f"seed {job.seed}: scoring", file=sys.stderr, flush=True)
    trl["heldout"] = {
        0: start,
        job.middle: evaluate(job, heldout_n, model=str(out / f"trl-step{job.middle}")),
        job.steps: evaluate(job, heldout_n, model=str(out / f"trl-step{job.steps}")),
    }
    echo["heldout"] = {
        0: start,
        job.middle: evaluate(job, heldout_n, data_dir=out / "echo-middle"),
        job.steps: evaluate(job, heldout_n, data_dir=out / "learner"),
    }
    gap = echo["heldout"][job.steps]["value"] - trl["heldout"][job.steps]["value"]
    cost = {name: per_completion(r["cpu_s"], job) for name, r in (("echo", echo), ("trl", trl))}
    return {
        "seed": job.seed,
        "heldout_echo": echo["heldout"][job.steps],
        "heldout_trl": trl["heldout"][job.steps],
        "heldout_gap": round(gap, 4),
        "operator_cpu_s_per_completion": cost,
        "operator_cost_ratio": round(cost["echo"] / cost["trl"], 3),
        "wall_s": {"echo": echo["wall_s"], "trl": trl["wall_s"]},
        "wall_ratio": round(echo["wall_s"] / trl["wall_s"], 3),
        "echo": echo,
        "trl": trl,
    }


def objective_parity(root: Path) -> dict:
    """Our loss and gradient norm against TRL's on one fixed batch, per
    variant: tests/learner/test_vs_trl.py run here, its measured
    differences read from its --junitxml properties."""
    report = root / "objective_parity.xml"
    test = ROOT / "tests" / "learner" / "test_vs_trl.py"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), "-k", "equal_trl"]
    cmd += ["-o", "junit_family=xunit1", f"--junitxml={report}"]
    ran = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    variants: dict[str, dict] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        variant = case.get("name", "").partition("[")[2].rstrip("]")
        found = {p.get("name"): float(p.get("value")) for p in case.iter("property")}
        failed = case.find("failure") is not None or case.find("error") is not None
        variants[variant] = {k: float(f"{v:.3g}") for k, v in found.items()} | {"passed": not failed}
    worst = max((v.get("abs_delta_loss", math.inf) for v in variants.values()), default=math.inf)
    return {"variants": variants, "max_abs_delta_loss": worst, "pytest_rc": ran.returncode}


def phase_split(echo: dict) -> dict:
    """Our learner's CPU by phase, in ms per accepted batch (``/api/status`` ``load``)."""
    load = echo.get("load") or {}
    per_batch = load.get("cpu_ms_per_batch", {})
    return {name: round(ms, 1) for name, ms in per_batch.items()}


def plot(seeds: list[dict], job: Job, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_step = job.prompts_per_step * job.group_size
    fig, (by_completions, by_wall) = plt.subplots(1, 2, figsize=(11, 4.2))
    for result in seeds:
        for name, colour in (("echo", "tab:blue"), ("trl", "tab:orange")):
            run = result[name]
            times = {0: 0.0, **{s["step"]: s["elapsed_s"] for s in run["steps"]}}
            points = sorted((int(step), acc) for step, acc in run["heldout"].items())
            xs = [step * per_step for step, _ in points]
            ys = [acc["value"] for _, acc in points]
            errors = [[a["value"] - a["ci95"][0] for _, a in points], [a["ci95"][1] - a["value"] for _, a in points]]
            label = f"{'Echo Swarm' if name == 'echo' else 'TRL GRPOTrainer'} (seed {result['seed']})"
            style = "-" if result["seed"] == seeds[0]["seed"] else "--"
            by_completions.errorbar(xs, ys, yerr=errors, fmt="o" + style, color=colour, label=label, capsize=3)
            by_wall.plot([times.get(step, math.nan) for step, _ in points], ys, "o" + style, color=colour, label=label)
    by_completions.set_xlabel("completions trained on")
    by_wall.set_xlabel("wall-clock seconds (2 CPU cores)")
    for axis in (by_completions, by_wall):
        axis.set_ylabel(f"held-out greedy accuracy ({job.task.split(':')[1]})")
        axis.grid(alpha=0.3)
    by_wall.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, GRPO: Echo Swarm (learner + 1 llama.cpp node) vs TRL (bench/vs_trl.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps of each run (default: 40)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default: 0,1)")
    parser.add_argument("--heldout-n", type=int, default=200, help="held-out prompts scored (default: 200)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="answer budget (default: 64)")
    parser.add_argument("--dir", type=Path, default=None, help="keep runs, logs and weights here")
    parser.add_argument("--png", type=Path, default=None, help="write the accuracy plot here")
    parser.add_argument(
        "--trl-from",
        type=Path,
        default=None,
        help="take TRL's side from an earlier --dir of this bench (same job, same machine) instead of running it",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker is not None:
        trl_worker(Job(**json.loads(args.trl_worker)), args.dir)
        return 0

    root = args.dir or Path(os.environ.get("TMPDIR", "/tmp")) / "echo-vs-trl"
    root.mkdir(parents=True, exist_ok=True)
    base_job = Job(steps=args.steps, max_new_tokens=args.max_new_tokens)
    print("checking the objective against TRL's", file=sys.stderr, flush=True)
    parity = objective_parity(root)
    print("scoring the base model", file=sys.stderr, flush=True)
    start = evaluate(base_job, args.heldout_n)
    seeds = [
        one_seed(dataclasses.replace(base_job, seed=int(s)), root, args.heldout_n, start, args.trl_from)
        for s in args.seeds.split(",")
    ]
    if args.png:
        plot(seeds, base_job, args.png)
    targets = {
        "heldout_gap": all(s["heldout_gap"] >= -0.03 for s in seeds),
        "operator_cost_ratio": all(s["operator_cost_ratio"] <= 0.5 for s in seeds),
        "objective_parity": parity["pytest_rc"] == 0 and parity["max_abs_delta_loss"] <= 1e-5,
    }
    result = {
        "job": dataclasses.asdict(base_job) | {"seed": None},
        "heldout_n": args.heldout_n,
        "heldout_start": start,
        "objective_parity": parity,
        "seeds": [
            {k: v for k, v in s.items() if k not in ("echo", "trl")}
            | {
                "echo_phase_cpu_ms_per_batch": phase_split(s["echo"]),
                "echo_measurements": s["echo"]["measurements"],
                "reward_curve": {
                    name: [round(x["reward_mean"], 3) for x in s[name]["steps"] if "reward_mean" in x]
                    for name in ("echo", "trl")
                },
                "heldout_curve": {name: s[name]["heldout"] for name in ("echo", "trl")},
            }
            for s in seeds
        ],
        "targets_met": targets,
        "met": all(targets.values()),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
