"""The learner's log-prob recomputes: many batches of one version per forward pass.

Verification recomputes each batch's log-probs under the version it claims
(``echo_learner.verify.verifier``). One forward pass per batch spends most of its time
on what does not grow with the batch (the per-pass overhead of a small model,
the Python around it); batches waiting for the same version go through the
model together instead. Nothing waits to be batched: a pass starts as soon as
the previous one ends, with whatever arrived meanwhile (group commit). At low
load each batch has a pass of its own, as before; under load the passes grow
up to ``max_batches`` batches or ``max_tokens`` tokens.

What that buys depends on the batches' size (docs/learner.md, "Verification
at scale"): on one CPU core and the built-in model, small batches (one prompt,
4 completions of 8 tokens) are verified 3.4-3.9 times faster in passes of 8-32,
batches of 250 tokens 1.3-1.7 times, and batches of 1,000 tokens not at all: a
pass is then bound by the model's arithmetic, and passes much larger than
``max_tokens`` get slower (their logits leave the CPU's caches).

A batch's result depends only on its own tokens: padding and the shared pass
change none of its log-probs beyond float rounding (tests/learner/test_recompute.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import trio

from echo_learner.training.logprobs import ALTERNATIVES, TokenStats, grouped_logprobs, grouped_token_stats
from echo_learner.training.priority import lowered
from echo_learner.verify.emulate import Emulations
from echo_learner.verify.evidence import FAR_OFF, BatchEvidence, duplicate_surprise
from protocol.wire.rollout import RolloutBatch, RolloutGroup


@dataclass(frozen=True)
class LogprobError:
    """|reported - recomputed| log-prob over a batch's sampled tokens, how
    plausible the tokens are as samples at the job's temperature
    (``surprise_z``), and what the batch adds to its peer's evidence."""

    worst: float
    mean: float
    surprise_z: float = 0.0
    evidence: BatchEvidence = BatchEvidence()


@torch.no_grad()
def logprob_errors(
    model: torch.nn.Module,
    work: Sequence[tuple[Sequence[tuple[int, ...]], RolloutBatch]],
    pad_id: int,
    max_logit_bytes: int = 2**30,
    temperature: float = 1.0,
    emulations: Sequence[torch.nn.Module | None] = (),
) -> list[LogprobError]:
    """``logprob_error`` of each ``(prompts, batch)`` in ``work``, all in one
    pass through ``model`` (split only where the logits would outgrow
    ``max_logit_bytes``). ``emulations[i]``, when given, is ``model`` in the
    arithmetic batch i declares (``echo_learner.verify.emulate``): that batch is
    recomputed through it as well, in one more pass per emulation."""
    prompts = [p for ps, batch in work for p in _checked(ps, batch)]
    groups = [[c.tokens for c in g.completions] for _, batch in work for g in batch.groups]
    stats = iter(grouped_token_stats(model, prompts, groups, pad_id, max_logit_bytes, temperature))
    mine = [[next(stats) for _ in batch.groups] for _, batch in work]
    emulated: list[list[list[torch.Tensor]] | None] = [None] * len(work)
    for twin in {id(e): e for e in emulations if e is not None}.values():
        chosen = [i for i, e in enumerate(emulations) if e is twin]
        lps = iter(
            grouped_logprobs(
                twin,
                [p for i in chosen for p in work[i][0]],
                [[c.tokens for c in g.completions] for i in chosen for g in work[i][1].groups],
                pad_id,
                max_logit_bytes,
                temperature,
            )
        )
        for i in chosen:
            emulated[i] = [next(lps) for _ in work[i][1].groups]
    return [_error(batch, m, e) for (_, batch), m, e in zip(work, mine, emulated)]


def logprob_error(
    model: torch.nn.Module,
    prompts: Sequence[tuple[int, ...]],
    batch: RolloutBatch,
    pad_id: int,
    max_logit_bytes: int = 2**30,
    temperature: float = 1.0,
    emulation: torch.nn.Module | None = None,
) -> LogprobError:
    """|reported - recomputed| log-prob over every sampled token of ``batch``.

    ``model`` is the policy version the batch claims and ``prompts[i]`` the
    tokens of the prompt its group ``i`` answers (looked up by the caller:
    this runs in a worker thread and must not touch the pool).
    """
    return logprob_errors(model, [(prompts, batch)], pad_id, max_logit_bytes, temperature, [emulation])[0]


def _checked(prompts: Sequence[tuple[int, ...]], batch: RolloutBatch) -> Sequence[tuple[int, ...]]:
    assert len(prompts) == len(batch.groups), "one prompt per group"
    return prompts


# Whether the sampled tokens are what sampling at the job's temperature from the claimed
# version gives (after GRAIL's token-plausibility check). For each token, its
# surprise under the learner's recompute, -log p(token), minus the entropy of
# the distribution it was drawn from has mean 0 and a known variance; over a
# batch, z = sum(surprise - entropy) / sqrt(sum(variance)) is about standard
# normal for an honest node whatever its log-prob tolerance. Tokens picked by
# hand, sampled from another model, or greedily drift far from 0 (a forger can
# always report the exact log-probs of tokens it chose: the tolerance alone
# cannot catch that). The limits (``Tolerance.z``) are in echo_learner/verify/tolerance.py.
#
# Not quite normal where the policy is peaked: one honest token drawn at
# p = 1e-4 from a distribution of entropy ~0.01 is ~9 nats out while the whole
# batch's standard deviation is ~1, so a batch of one prompt scored |z| > 8
# about once in 750 (bench/convergence.py, sync, reward 0.8: two honest
# batches refused, each a strike and a 33 s pause). The largest single
# deviation is therefore added to the variance: one rare token moves z by
# less than 1, k of them by about k, while a forger's many shifted tokens
# still add up (tests/learner/test_logprob_check.py).
def _error(
    batch: RolloutBatch, mine: list[list[TokenStats]], emulated: list[list[torch.Tensor]] | None = None
) -> LogprobError:
    pairs = [
        (stats, torch.tensor(c.logprobs, dtype=torch.float32))
        for group, recomputed_group in zip(batch.groups, mine)
        for c, stats in zip(group.completions, recomputed_group)
    ]
    diff = torch.cat([(stats.logprobs - reported).abs() for stats, reported in pairs])
    deviations = torch.cat([-stats.logprobs - stats.entropy for stats, _ in pairs])
    spread = sum(float(stats.variance.sum()) for stats, _ in pairs) + float(deviations.abs().max()) ** 2
    z = float(deviations.sum()) / math.sqrt(spread) if spread > 0 else 0.0
    emulated_off = None
    if emulated is not None:
        twins = [t for group in emulated for t in group]
        emulated_off = float(sum((t - stats.logprobs).abs().sum() for t, (stats, _) in zip(twins, pairs)))
    signed = torch.cat([reported - stats.logprobs for stats, reported in pairs])
    evidence = BatchEvidence(
        tokens=len(diff),
        groups=len(batch.groups),
        reported_off=float(diff.sum()),
        signed_off=float(signed.sum()),
        far_off=int((diff > FAR_OFF).sum()),
        surprise=float(deviations.sum()),
        surprise_var=sum(float(stats.variance.sum()) for stats, _ in pairs),
        emulated_off=emulated_off,
        **{test: float(sum(getattr(stats, test).sum() for stats, _ in pairs)) for test in ALTERNATIVES},
        duplicates=sum(_repeats(group, stats) for group, stats in zip(batch.groups, mine)),
    )
    return LogprobError(worst=float(diff.max()), mean=float(diff.mean()), surprise_z=z, evidence=evidence)


def _repeats(group: RolloutGroup, stats: list[TokenStats]) -> float:
    """-ln of the chance of ``group``'s repeated completions under the
    policy, summed over the completions repeated (0: none repeated)."""
    seen: dict[tuple[int, ...], list] = {}
    for c, s in zip(group.completions, stats):
        seen.setdefault(c.tokens, [0, float(s.logprobs.sum())])[0] += 1
    size = len(group.completions)
    return sum(duplicate_surprise(size, k, logprob) for k, logprob in seen.values() if k > 1)


@dataclass(frozen=True)
class Pass:
    """What one recompute pass did, for the meters: the version, its wall and
    worker-thread CPU seconds, and the batches and rollouts it covered."""

    version: int
    seconds: float
    cpu_s: float
    batches: int
    rollouts: int


@dataclass(eq=False)
class _Job:
    version: int
    prompts: Sequence[tuple[int, ...]]
    batch: RolloutBatch
    emulate: tuple[str, str] | None = None  # (backend, dtype) whose arithmetic to recompute it in too
    done: trio.Event = field(default_factory=trio.Event)
    result: LogprobError | None = None

    @property
    def tokens(self) -> int:
        """What the pass computes for it: its prompts, and each completion."""
        return sum(len(p) for p in self.prompts) + sum(len(c.tokens) for g in self.batch.groups for c in g.completions)


class Recomputer:
    """Queues recomputes and runs them, those of one version together.

    ``run`` is the one task that drives the passes (in the learner's nursery);
    callers wait in ``error``. The queue holds at most one entry per batch
    whose handler is waiting, and those are bounded by the rollout streams a
    learner admits.
    """

    def __init__(
        self,
        models: Callable[[int], torch.nn.Module | None],
        *,
        pad_id: int,
        max_logit_bytes: int,
        temperature: float,
        max_batches: int,
        max_tokens: int = 1024,
        emulated_versions: int = 2,
        on_pass: Callable[[Pass], None] = lambda p: None,
    ):
        self.models = models
        self.pad_id = pad_id
        self.max_logit_bytes = max_logit_bytes
        self.temperature = temperature
        self.max_batches = max_batches
        self.max_tokens = max_tokens
        self.on_pass = on_pass
        # Any version a batch may claim: a node picks the version it generates
        # with, so a cheat must not hide in the versions never checked.
        self.emulations = Emulations(keep=emulated_versions)
        self._queue: list[_Job] = []
        self._queued = trio.Event()

    async def error(
        self,
        version: int,
        prompts: Sequence[tuple[int, ...]],
        batch: RolloutBatch,
        emulate: tuple[str, str] | None = None,
    ) -> LogprobError | None:
        """``batch``'s log-prob error under ``version`` (and, given ``emulate``,
        its distance in that backend's and dtype's arithmetic); None if the
        learner no longer holds that version when its pass comes."""
        job = _Job(version, prompts, batch, emulate)
        self._queue.append(job)
        self._queued.set()
        try:
            await job.done.wait()
        finally:
            if not job.done.is_set() and job in self._queue:  # cancelled before its pass: nobody wants it
                self._queue.remove(job)
        return job.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if not self._queue:
                self._queued = trio.Event()
                await self._queued.wait()
            jobs = self._next_pass()
            model = self.models(jobs[0].version)
            if model is not None:
                results, done = await trio.to_thread.run_sync(lowered, self._recompute, model, jobs)
                for job, result in zip(jobs, results):
                    job.result = result
                self.on_pass(done)
            for job in jobs:
                job.done.set()

    def _next_pass(self) -> list[_Job]:
        """The oldest waiting batch and those of its version after it, up to
        ``max_batches`` batches and ``max_tokens`` tokens (at least one batch)."""
        version = self._queue[0].version
        jobs: list[_Job] = []
        tokens = 0
        for job in self._queue:
            if job.version != version:
                continue
            tokens += job.tokens
            if jobs and (len(jobs) == self.max_batches or tokens > self.max_tokens):
                break
            jobs.append(job)
        taken = set(map(id, jobs))
        self._queue = [j for j in self._queue if id(j) not in taken]
        return jobs

    def _recompute(self, model: torch.nn.Module, jobs: list[_Job]) -> tuple[list[LogprobError], Pass]:
        """In the worker thread: one pass, metered in that thread's own CPU time."""
        wall, cpu = time.monotonic(), time.thread_time()
        twins = [None if j.emulate is None else self.emulations.get(j.version, model, *j.emulate) for j in jobs]
        results = logprob_errors(
            model, [(j.prompts, j.batch) for j in jobs], self.pad_id, self.max_logit_bytes, self.temperature, twins
        )
        done = Pass(
            version=jobs[0].version,
            seconds=time.monotonic() - wall,
            cpu_s=time.thread_time() - cpu,
            batches=len(jobs),
            rollouts=sum(len(g.completions) for j in jobs for g in j.batch.groups),
        )
        return results, done
