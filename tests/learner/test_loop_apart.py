"""Training and verification run beside the event loop that answers
volunteers, never on it (issue 72): while a training step and a batch of
log-prob recomputes run, the learner's loop still wakes on time. On a GPU the
same threads hold the arithmetic: torch releases the GIL inside each op."""

import random

import trio

from echo_learner.training.model import build_model
from echo_learner.training.priority import lowered
from echo_learner.training.trainer import Objective, ScoredGroup, Trainer
from echo_learner.verify.recompute import Recomputer
from protocol.messages import UNSIGNED
from protocol.wire.rollout import Completion, RolloutBatch, RolloutGroup

PAD, BOS, EOS, SEP = 256, 257, 258, 61
PERIOD_S = 0.005


def work(rng: random.Random, groups: int) -> list[ScoredGroup]:
    out = []
    for _ in range(groups):
        prompt = (BOS, *(rng.randrange(97, 101) for _ in range(rng.randint(3, 12))), SEP)
        completions = tuple(tuple(rng.randrange(97, 101) for _ in range(rng.randint(2, 16))) for _ in range(16))
        out.append(
            ScoredGroup(
                prompt,
                completions,
                tuple((-1.4,) * len(c) for c in completions),
                tuple(rng.random() for _ in range(16)),
            )
        )
    return out


def batch_of(group: ScoredGroup) -> RolloutBatch:
    completions = tuple(Completion(c, b) for c, b in zip(group.completions, group.behaviour_logprobs))
    return RolloutBatch(
        "loop", 0, "node", b"n" * 16, "torch", "f32", "cpu", 0, (RolloutGroup(0, completions),), UNSIGNED
    )


async def lateness(during) -> tuple[list[float], float]:
    """How late a loop task sleeping ``PERIOD_S`` again and again woke, while ``during()`` ran; and how long it ran."""
    late: list[float] = []
    done = trio.Event()

    async def probe() -> None:
        while not done.is_set():
            start = trio.current_time()
            await trio.sleep(PERIOD_S)
            late.append(trio.current_time() - start - PERIOD_S)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe)
        await trio.sleep(2 * PERIOD_S)
        started = trio.current_time()
        await during()
        took = trio.current_time() - started
        done.set()
    return sorted(late), took


async def test_training_and_verification_leave_the_event_loop_on_time():
    rng = random.Random(0)
    model = build_model()
    trainer = Trainer(model, lr=1e-4, objective=Objective(0.2, 3.0, 0.0), pad_id=PAD)
    step_groups = work(rng, 256)
    checked = work(rng, 64)
    recomputer = Recomputer(lambda version: model, pad_id=PAD, max_logit_bytes=2**28, temperature=1.0, max_batches=16)

    async def train_and_verify() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(recomputer.run)
            for group in checked:
                nursery.start_soon(recomputer.error, 0, [group.prompt_tokens], batch_of(group))
            # As the learner trains (echo_learner/service.py): a worker thread.
            await trio.to_thread.run_sync(lowered, trainer.step, step_groups)
            while recomputer._queue:  # the recomputes still waiting
                await trio.sleep(PERIOD_S)
            nursery.cancel_scope.cancel()

    late, took = await lateness(train_and_verify)
    assert took > 0.3  # enough work to see a stall
    assert late[int(0.99 * len(late))] < 0.05, (late[-5:], took)

    # The probe sees a stall: the same step run on the loop holds it throughout.
    async def on_the_loop() -> None:
        trainer.step(step_groups)

    late, took = await lateness(on_the_loop)
    assert late[-1] > 0.8 * took
