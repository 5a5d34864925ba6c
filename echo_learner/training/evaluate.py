"""Held-out evaluation: how often a model solves prompts that training never saw.

``echo-learner eval`` scores the newest checkpoint of a run (or, with
``--base``, the model it started from) on the task's held-out split: once
with greedy decoding, and with ``k`` samples per prompt at the run's temperature
(pass@1 = the mean share of samples solved). A completion counts as solved
when its reward is at least ``SOLVED``: a right answer, for every task we
ship. Each accuracy comes with a 95 % confidence interval.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import threading
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteria, StoppingCriteriaList

from echo_learner.tasks.base import Task, TaskError
from echo_learner.training.device import of as device_of
from echo_learner.training.lora import restore
from echo_learner.training.model import render_prompt, stop_ids
from protocol.process.progress import progress

SOLVED = 0.9
Z95 = 1.96


class Stopped(Exception):
    """The evaluation was asked to stop (its ``stop`` event was set)."""


class _UntilSet(StoppingCriteria):
    """Ends generation at the next token once ``event`` is set, so that a
    worker thread scoring a model can be stopped within one forward pass."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """What to score a model on, and how to generate (``echo-learner eval``'s
    flags; the learner's held-out scoring as it trains)."""

    n: int  # held-out prompts
    k: int  # samples per prompt for pass@1; 0 for greedy decoding only
    max_new_tokens: int  # the answer budget
    system_prompt: str = ""
    batch: int = 16  # sequences generated at once
    seed: int = 0  # seeds the pass@1 samples
    temperature: float = 1.0  # of the pass@1 samples
    show_progress: bool = False  # a progress bar: echo-learner eval's, not the learner's (its training bar runs)


@dataclass(frozen=True)
class Accuracy:
    value: float
    ci95: tuple[float, float]


def wilson(solved: int, n: int) -> Accuracy:
    """Share solved with its Wilson score interval (good at 0 and 1 too)."""
    p = solved / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return Accuracy(round(p, 4), (round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)))


def mean_with_ci(values: list[float]) -> Accuracy:
    """Mean of per-prompt shares with a normal interval (prompts are the
    independent units; samples of one prompt are not)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = Z95 * sd / math.sqrt(n)
    return Accuracy(round(mean, 4), (round(max(0.0, mean - half), 4), round(min(1.0, mean + half), 4)))


@torch.no_grad()
def complete(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[tuple[int, ...]],
    settings: EvalSettings,
    *,
    samples: int,
    greedy: bool,
    stop: threading.Event | None = None,
) -> list[list[str]]:
    """``samples`` completions of each prompt (greedy, or sampled at the
    settings' temperature), as text up to the first stop token; ``Stopped``
    soon after ``stop`` is set."""
    batch = settings.batch
    stop = stop or threading.Event()
    stops = stop_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = [p for p in prompts for _ in range(samples)]
    texts: list[str] = []
    desc = "greedy" if greedy else f"{samples} samples"
    # A bar only where asked (echo-learner eval): the learner's held-out runs beside its training bar.
    shown = progress(desc, len(rows)) if settings.show_progress else contextlib.nullcontext(lambda *_, **__: None)
    with shown as bar:
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            width = max(len(r) for r in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attention = torch.zeros_like(input_ids)
            for i, r in enumerate(chunk):  # left padding, as generation needs
                input_ids[i, width - len(r) :] = torch.tensor(r)
                attention[i, width - len(r) :] = 1
            sampling = (
                {"do_sample": False}
                if greedy
                else {"do_sample": True, "temperature": settings.temperature, "top_k": 0, "top_p": 1.0}
            )
            where = device_of(model)
            out = model.generate(
                input_ids=input_ids.to(where),
                attention_mask=attention.to(where),
                max_new_tokens=settings.max_new_tokens,
                eos_token_id=sorted(stops),
                pad_token_id=pad,
                use_cache=True,  # a model saved by a trainer may have it off (TRL's): 40x slower
                stopping_criteria=StoppingCriteriaList([_UntilSet(stop)]),
                **sampling,
            )
            if stop.is_set():
                raise Stopped
            for row in out[:, width:].tolist():
                end = next((i for i, t in enumerate(row) if t in stops), len(row))
                texts.append(tokenizer.decode(row[:end], skip_special_tokens=True))
            bar(start + len(chunk))
    return [texts[i : i + samples] for i in range(0, len(texts), samples)]


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    settings: EvalSettings,
    *,
    stop: threading.Event | None = None,
) -> dict:
    """Greedy accuracy and pass@1 over ``k`` samples on ``n`` held-out
    prompts (``settings``); ``Stopped`` soon after ``stop`` is set."""
    k = settings.k
    heldout = task.heldout(settings.n)
    if not heldout:
        raise TaskError(f"task {task.name} has no held-out prompts to evaluate on")
    if k:  # greedy decoding draws nothing: the process's RNGs stay as they are
        random.seed(settings.seed)
        torch.manual_seed(settings.seed)
    prompts = [render_prompt(tokenizer, p.text, settings.system_prompt) for p in heldout]
    greedy = complete(model, tokenizer, prompts, settings, samples=1, greedy=True, stop=stop)
    rewards = [task.reward(p, c[0]) for p, c in zip(heldout, greedy)]
    result: dict = {
        "task": task.name,
        "heldout_n": len(heldout),
        "greedy": asdict(wilson(sum(r >= SOLVED for r in rewards), len(rewards))),
        "greedy_mean_reward": round(sum(rewards) / len(rewards), 4),
        "k": k,
        "example": {"prompt": heldout[0].text, "answer": heldout[0].answer, "completion": greedy[0][0]},
    }
    if k:
        sampled = complete(model, tokenizer, prompts, settings, samples=k, greedy=False, stop=stop)
        shares = [sum(task.reward(p, c) >= SOLVED for c in cs) / k for p, cs in zip(heldout, sampled)]
        result["pass1"] = asdict(mean_with_ci(shares))
    return result


def command(args: argparse.Namespace, prog: str) -> None:
    """``echo-learner eval``: the run's settings (its config.json) unless flags
    say otherwise; the newest checkpoint unless ``--base``."""
    from echo_learner.tasks.registry import load_task
    from echo_learner.training import checkpoint
    from echo_learner.training.device import DeviceUnavailable, choose
    from echo_learner.training.model import ModelError, describe, load_model
    from protocol.process.config import fail

    if args.n < 1 or args.k < 0 or args.batch < 1 or args.temperature < 0:
        fail(prog, "-n and --batch must be at least 1, -k and --temperature at least 0")
    saved_path = args.data_dir / "config.json"
    saved = json.loads(saved_path.read_text()) if saved_path.exists() else {}
    source = args.model if args.model is not None else saved.get("model", "")
    try:
        device, _why = choose(args.device)
        task = load_task(args.task or saved.get("task", "reverse"))
        state = None if args.base else checkpoint.load(args.data_dir / "checkpoint.pt")
        if state is not None and state.get("model_source", "") != source:
            trained = state.get("model_source") or "(built-in)"
            raise ModelError(f"the checkpoint trains --model {trained!r}, not {source or '(built-in)'!r}")
        model, tokenizer = load_model(source, saved.get("seed", 0))
    except DeviceUnavailable as exc:
        fail(prog, str(exc))
    except (TaskError, ModelError, checkpoint.CheckpointError) as exc:
        hint = "" if args.base else " (--base evaluates the model a run starts from)"
        fail(prog, f"{exc}{hint}")
    if state is not None:
        model = restore(model, state)
    model.to(device)
    settings = EvalSettings(
        n=args.n,
        k=args.k,
        batch=args.batch,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens or saved.get("max_new_tokens") or task.max_new_tokens,
        system_prompt=args.system_prompt or saved.get("system_prompt") or task.system_prompt,
        temperature=args.temperature or saved.get("temperature", 1.0),
        show_progress=True,
    )
    result = evaluate(model, tokenizer, task, settings)
    result["model"] = describe(source)
    result["temperature"] = args.temperature or saved.get("temperature", 1.0)
    result["step"] = None if state is None else state["step"]
    if args.json:
        print(json.dumps(result))
        return
    what = "base model" if state is None else f"step {state['step']} (version {state['version']})"
    print(f"{result['model']}, {what}, task {task.name}, {result['heldout_n']} held-out prompts")
    lo, hi = result["greedy"]["ci95"]
    print(f"greedy accuracy  {result['greedy']['value']:.3f}  (95% CI {lo:.3f}-{hi:.3f})")
    if args.k:
        lo, hi = result["pass1"]["ci95"]
        print(
            f"pass@1 ({args.k} samples at temperature {result['temperature']})  {result['pass1']['value']:.3f}  (95% CI {lo:.3f}-{hi:.3f})"
        )
