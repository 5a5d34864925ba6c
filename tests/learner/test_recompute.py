"""Batched log-prob recomputes: many batches of one version in one pass give
each batch the verdict it would get alone, and the queue behind them groups,
caps and lets go as it says. Real torch model, real sampled rollouts."""

import dataclasses
import random

import pytest
import torch
import trio
import trio.testing

from echo_learner.verify.recompute import Pass, Recomputer, logprob_error, logprob_errors
from echo_learner.verify.tolerance import tolerance
from echo_learner.verify.verifier import BAD_LOGPROBS, check_logprobs
from protocol.wire.rollout import Completion
from tests.learner.test_logprob_check import sample_batches, versions

PAD = 256


def some_batches(model, n, seed=0):
    """``n`` honest batches of differing shapes: prompt lengths, group counts, completion lengths."""
    rng = random.Random(seed)
    return [
        next(sample_batches(model, rng, 1, max_new_tokens=rng.choice((3, 8, 20)), prompts_per_batch=rng.randint(1, 4)))
        for _ in range(n)
    ]


def shifted(batch):
    """``batch`` with one completion's reported log-probs moved by 0.5: a forgery."""
    group = batch.groups[0]
    bad = Completion(group.completions[0].tokens, tuple(x - 0.5 for x in group.completions[0].logprobs))
    return dataclasses.replace(
        batch, groups=(dataclasses.replace(group, completions=(bad, *group.completions[1:])), *batch.groups[1:])
    )


def test_batches_recomputed_together_get_the_errors_they_get_alone():
    model = next(versions(1))
    work = some_batches(model, 6)
    work[3] = (work[3][0], shifted(work[3][1]))
    together = logprob_errors(model, work, PAD)
    alone = [logprob_error(model, prompts, batch, PAD) for prompts, batch in work]
    allowed = tolerance("torch", "f32")
    for i, (t, a) in enumerate(zip(together, alone)):
        assert t.worst == pytest.approx(a.worst, abs=1e-5)
        assert t.mean == pytest.approx(a.mean, abs=1e-6)
        assert t.surprise_z == pytest.approx(a.surprise_z, abs=1e-4)
        # The forgery is caught in company, and its company is not blamed for it.
        assert check_logprobs(t, allowed) == (BAD_LOGPROBS if i == 3 else None), i


def test_a_small_logit_budget_splits_the_pass_without_changing_a_result():
    model = next(versions(1))
    work = some_batches(model, 4, seed=1)
    roomy = logprob_errors(model, work, PAD)
    tight = logprob_errors(model, work, PAD, max_logit_bytes=64 * 1024)  # a few rows per pass
    for r, t in zip(roomy, tight):
        assert t.worst == pytest.approx(r.worst, abs=1e-5) and t.mean == pytest.approx(r.mean, abs=1e-6)


async def test_waiting_batches_share_a_pass_by_version_up_to_the_cap():
    old, new = versions(2)
    models = {1: old, 2: new}
    passes: list[Pass] = []
    recomputer = Recomputer(
        models.get,
        pad_id=PAD,
        max_logit_bytes=2**30,
        temperature=1.0,
        max_batches=3,
        max_tokens=10**6,
        on_pass=passes.append,
    )
    work = {1: some_batches(old, 4, seed=2), 2: some_batches(new, 2, seed=3)}
    results: dict[tuple[int, int], object] = {}

    async def one(version, i):
        prompts, batch = work[version][i]
        results[version, i] = await recomputer.error(version, prompts, batch)

    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as callers:
            for version in (1, 2):
                for i in range(len(work[version])):
                    callers.start_soon(one, version, i)
            # All six wait before the first pass starts: one version's four
            # go three and one, the other's two together.
            await trio.testing.wait_all_tasks_blocked()
            await nursery.start(recomputer.run)
        nursery.cancel_scope.cancel()
    assert sorted((p.version, p.batches) for p in passes) == [(1, 1), (1, 3), (2, 2)]
    for (version, i), error in results.items():
        prompts, batch = work[version][i]
        assert error.worst == pytest.approx(logprob_error(models[version], prompts, batch, PAD).worst, abs=1e-5)
    assert all(p.cpu_s > 0 and p.rollouts > 0 for p in passes)


async def test_a_version_dropped_while_waiting_gives_none_and_a_cancelled_wait_leaves_the_queue():
    model = next(versions(1))
    held = {5: model}
    recomputer = Recomputer(held.get, pad_id=PAD, max_logit_bytes=2**30, temperature=1.0, max_batches=8)
    ((prompts, batch),) = some_batches(model, 1)
    with trio.move_on_after(1):
        await recomputer.error(5, prompts, batch)  # nobody runs the queue: waits until cancelled
    assert recomputer._queue == []
    del held[5]
    async with trio.open_nursery() as nursery:
        await nursery.start(recomputer.run)
        assert await recomputer.error(5, prompts, batch) is None
        nursery.cancel_scope.cancel()


def test_one_batch_at_a_time_is_still_one_pass_each():
    """--verify-batch 1, the baseline bench/swarm_load.py compares with."""
    model = next(versions(1))
    passes: list[Pass] = []
    recomputer = Recomputer(
        {0: model}.get, pad_id=PAD, max_logit_bytes=2**30, temperature=1.0, max_batches=1, on_pass=passes.append
    )
    work = some_batches(model, 3, seed=4)

    async def main():
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as callers:
                for prompts, batch in work:
                    callers.start_soon(recomputer.error, 0, prompts, batch)
                await trio.testing.wait_all_tasks_blocked()
                await nursery.start(recomputer.run)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [p.batches for p in passes] == [1, 1, 1]
    assert torch.is_grad_enabled()  # the no-grad recompute left the caller's mode alone


def test_a_pass_stops_at_its_token_budget_but_always_takes_one_batch():
    from echo_learner.verify.recompute import _Job

    model = next(versions(1))
    work = some_batches(model, 4, seed=5)
    jobs = [_Job(0, prompts, batch) for prompts, batch in work]
    budget = jobs[0].tokens + jobs[1].tokens
    recomputer = Recomputer(
        {0: model}.get, pad_id=PAD, max_logit_bytes=2**30, temperature=1.0, max_batches=8, max_tokens=budget
    )
    recomputer._queue = list(jobs)
    assert recomputer._next_pass() == jobs[:2]
    recomputer.max_tokens = 1  # smaller than any batch: one at a time
    assert recomputer._next_pass() == jobs[2:3]
