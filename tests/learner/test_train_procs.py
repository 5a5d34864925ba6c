"""``--train-procs 2``: two torchrun ranks with FSDP train exactly as one process does."""

import copy

import pytest
import torch

from echo_learner.training.model import build_model
from echo_learner.training.train_group import TrainGroup, TrainGroupError
from echo_learner.training.trainer import Objective, Passes, ScoredGroup, Trainer

pytestmark = pytest.mark.procs  # torchrun and its ranks: the full suite only

OBJ = Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.05)
LR = 1e-3


def settings(**over) -> dict:
    base = {
        "model": "",
        "seed": 0,
        "lora": None,
        "lr": LR,
        "objective": {"clip_eps": OBJ.clip_eps, "ratio_cap": OBJ.ratio_cap, "kl_coef": OBJ.kl_coef},
        "pad_id": 256,
        "max_logit_bytes": 2**30,
        "temperature": 0.8,
        "device": "cpu",
        "threads": 1,
    }
    return {**base, **over}


def batches(steps: int, seed: int = 3) -> list[list[ScoredGroup]]:
    """Random groups of uneven lengths (an odd number of rows: ranks get unequal shares)."""
    g = torch.Generator().manual_seed(seed)

    def rand(n, lo, hi):
        return tuple(int(x) for x in torch.randint(lo, hi, (n,), generator=g))

    out = []
    for _ in range(steps):
        groups = []
        for p in range(3):
            prompt = (257, *rand(2 + p, 97, 101), 61)
            completions = tuple(rand(int(torch.randint(1, 20, (1,), generator=g)), 0, 259) for _ in range(3))
            behaviour = tuple(tuple(-2.0 for _ in c) for c in completions)
            rewards = tuple(float(x) for x in torch.rand(3, generator=g))
            groups.append(ScoredGroup(prompt, completions, behaviour, rewards))
        out.append(groups)
    return out


def one_process(steps: list[list[ScoredGroup]], checkpoint: tuple[dict, dict] | None = None):
    model = build_model()
    # As the learner does: the trainer (and its KL reference) first, from the
    # starting weights; then a checkpoint's state.
    trainer = Trainer(
        model, lr=LR, objective=OBJ, pad_id=256, temperature=0.8, passes=Passes(pack=False)
    )  # as the ranks run it
    if checkpoint is not None:
        model.load_state_dict(checkpoint[0])
        trainer.resume(copy.deepcopy(checkpoint[1]))  # AdamW counts its steps in the state's own tensors
    return [trainer.step(b) for b in steps], trainer


# Two ranks sum a gradient in another order than one process: float32
# rounding, which AdamW's normalisation turns into up to ~1e-3 of a step
# (2.5e-6 after three steps of LR 1e-3 on this machine on 2026-11-29; under 2e-6 the day before). A rank
# that trained on the wrong rows or weights moves weights by about a step.
WEIGHT_ATOL = LR / 100


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x, y, atol=WEIGHT_ATOL, rtol=1e-5), (name, (x - y).abs().max())


def test_two_ranks_step_like_one_process_and_resume():
    steps = batches(3)
    expected, reference = one_process(steps)
    assert any(p.abs().max() > 0 for p in reference.optimizer_state()["state"][0].values() if p.dim())

    model = build_model()
    with TrainGroup(model, procs=2, settings=settings()) as group:
        stats = [group.step(b) for b in steps[:2]]
        group.sync()
        checkpoint_model, checkpoint_opt = copy.deepcopy(model.state_dict()), group.optimizer_state()
        stats.append(group.step(steps[2]))
        group.sync()
    for got, want in zip(stats, expected):
        assert got.tokens == want.tokens > 0
        assert abs(got.loss - want.loss) < 1e-5 and abs(got.kl - want.kl) < 1e-6
    assert_same_weights(model, reference.model)

    # Resume from the group's checkpoint, in one process and in two.
    _, resumed = one_process(steps[2:], checkpoint=(checkpoint_model, checkpoint_opt))
    assert_same_weights(resumed.model, reference.model)
    model = build_model()
    with TrainGroup(model, procs=2, settings=settings()) as group:
        model.load_state_dict(checkpoint_model)
        group.resume(checkpoint_opt)
        group.step(steps[2])
        group.sync()
    assert_same_weights(model, reference.model)


def test_lora_adapters_train_alike_on_two_ranks():
    from echo_learner.training.lora import LoraSettings, wrap

    lora = LoraSettings(rank=4, alpha=8.0, dropout=0.0, targets=("q_proj", "v_proj"))
    one = wrap(build_model(), lora)
    with torch.no_grad():  # B starts at zero; make the adapters do something from the first step
        for name, p in one.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
    two = copy.deepcopy(one)
    # No KL: its reference is the model the ranks build (B = 0), not these weights.
    no_kl = Objective(OBJ.clip_eps, OBJ.ratio_cap, kl_coef=0.0)
    trainer = Trainer(one, lr=1e-2, objective=no_kl, pad_id=256, temperature=0.8, passes=Passes(pack=False))
    objective = {"clip_eps": no_kl.clip_eps, "ratio_cap": no_kl.ratio_cap, "kl_coef": 0.0}
    with TrainGroup(two, procs=2, settings=settings(lr=1e-2, lora=lora.as_dict(), objective=objective)) as group:
        for batch in batches(2):
            want, got = trainer.step(batch), group.step(batch)
            assert abs(got.loss - want.loss) < 1e-5
        group.sync()
    assert_same_weights(two, one)
    assert any(
        "lora" in k and not torch.equal(v, w)
        for (k, v), w in zip(one.state_dict().items(), wrap(build_model(), lora).state_dict().values())
    )


def test_a_failing_request_is_reported_and_the_ranks_stop():
    model = build_model()
    with TrainGroup(model, procs=2, settings=settings()) as group:
        bad = [
            ScoredGroup((257,), ((1,), (2, 3)), ((-1.0,), (-1.0, -1.0)), (1.0, 0.0)),
            ScoredGroup((257,), ((1,),), ((-1.0,),), (1.0,)),
        ]
        with pytest.raises(TrainGroupError, match="different sizes"):
            group.step(bad)
        process = group.process
    assert process.poll() is not None


def test_a_rank_that_dies_ends_the_group_with_a_clear_error():
    import psutil

    model = build_model()
    with TrainGroup(model, procs=2, settings=settings()) as group:
        ranks = [
            p
            for p in psutil.Process(group.process.pid).children()
            if "echo_learner.training.train_worker" in p.cmdline()
        ]
        assert len(ranks) == 2
        ranks[-1].kill()
        with pytest.raises(TrainGroupError, match="went away|failed .step."):
            for batch in batches(3):  # torchrun notices within its monitor interval
                group.step(batch)
                group.sync()
    assert group.process.poll() is not None
