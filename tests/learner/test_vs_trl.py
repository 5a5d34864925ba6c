"""Our loss equals TRL's GRPOTrainer's, variant by variant, on one fixed batch.

The batch (prompts, completions, the node's behaviour log-probs, rewards) is
handed to TRL as its own: through ``rollout_func``, its hook for outside
generation, and a reward function returning our rewards. TRL computes the
advantages and the reference log-probs itself; its ``compute_loss`` gives
the loss. Both sides start from the same weights, moved off the reference
so that the KL term counts.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from echo_learner.training.logprobs import completion_logprobs
from echo_learner.training.model import build_model, build_tokenizer
from echo_learner.training.trainer import Batch, Objective, Passes, ScoredGroup, Trainer

GROUP = 4
MAX_COMPLETION_LENGTH = 8
TEMPERATURE = 0.7
# Equal lengths: TRL pads prompts on the left and does not shift position ids,
# so unequal prompts would be read at other positions than ours.
PROMPTS = [(257, 97, 98, 99, 61), (257, 98, 98, 97, 61)]
COMPLETIONS = [
    (99, 98, 97, 258),
    (97, 97, 258),
    (99, 98, 258),
    (97, 258),
    (98, 98, 97, 258),
    (97, 98, 98, 97, 258),
    (98, 258),
    (97, 97, 97),  # cut at the length limit: no end token
]
REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0]

# TRL's settings, and ours with the same meaning.
VARIANTS = {
    "trl_default_dapo": {"loss_type": "dapo"},
    "bnpo_kl": {"loss_type": "bnpo", "beta": 0.04},
    "grpo": {"loss_type": "grpo", "beta": 0.04},
    "grpo_plain_kl": {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "dapo_clip_higher_batch_scale": {"loss_type": "dapo", "epsilon_high": 0.28, "scale_rewards": "batch"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
}


def ours(trl: dict) -> Objective:
    return Objective(
        clip_eps=trl.get("epsilon", 0.2),
        clip_eps_high=trl.get("epsilon_high"),
        ratio_cap=trl["delta"],
        kl_coef=trl.get("beta", 0.0),
        kl_importance_weighted=trl.get("use_bias_correction_kl", True),
        loss_type=trl["loss_type"],
        scale_rewards=trl.get("scale_rewards", "group"),
        importance_level=trl.get("importance_sampling_level", "token"),
        max_completion_length=MAX_COMPLETION_LENGTH,
    )


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """The starting weights on disk (TRL loads its reference from there), the
    weights both sides train from (moved off the start, so KL > 0), and the
    node's log-probs: the start's, blurred so that ratios clip and cap."""
    path = tmp_path_factory.mktemp("base")
    base, tokenizer = build_model(), build_tokenizer()
    base.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.manual_seed(1)
    moved = {name: t + 0.02 * torch.randn_like(t) for name, t in base.state_dict().items()}
    with torch.no_grad():
        logprobs, mask = completion_logprobs(
            base, [PROMPTS[i // GROUP] for i in range(8)], COMPLETIONS, 256, TEMPERATURE
        )
    behaviour = [tuple((row[m.bool()] + 0.4 * torch.randn(int(m.sum()))).tolist()) for row, m in zip(logprobs, mask)]
    return path, tokenizer, moved, behaviour


def grad_norm(model: torch.nn.Module) -> float:
    return float(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm())


def trl_loss(start, settings: dict, out_dir) -> tuple[float, float]:
    path, tokenizer, moved, behaviour = start

    def rollout(prompts, trainer):
        return {
            "prompt_ids": [list(PROMPTS[i // GROUP]) for i in range(len(prompts))],
            "completion_ids": [list(c) for c in COMPLETIONS],
            "logprobs": [list(b) for b in behaviour],
        }

    def reward(completions, completion_ids, **kwargs):
        return REWARDS[: len(completion_ids)]

    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=len(COMPLETIONS),
        num_generations=GROUP,
        max_completion_length=MAX_COMPLETION_LENGTH,
        temperature=TEMPERATURE,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        model_init_kwargs={"dtype": torch.float32},
        **settings,
    )
    dataset = Dataset.from_list([{"prompt": "abc="}, {"prompt": "bba="}])
    trainer = GRPOTrainer(
        model=str(path),
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's training loop sets
    model = trainer.model
    model.load_state_dict(moved)
    model.train()
    inputs = trainer._generate_and_score_completions([{"prompt": "abc="}] * GROUP + [{"prompt": "bba="}] * GROUP)
    # Ours: the node's log-probs. TRL on-policy takes its own (ratio 1), and
    # reads the old policy's from here when it has them.
    old = torch.zeros(inputs["completion_mask"].shape)
    for i, b in enumerate(behaviour):
        old[i, : len(b)] = torch.tensor(b)
    inputs["old_per_token_logps"] = old
    model.zero_grad()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    return float(loss), grad_norm(model)


def echo_loss(
    start, objective: Objective, max_logit_bytes: int = 2**30, share_prompts: bool = True
) -> tuple[float, float]:
    _, tokenizer, moved, behaviour = start
    model = build_model()
    trainer = Trainer(
        model,
        lr=1e-5,
        objective=objective,
        pad_id=tokenizer.pad_token_id,
        temperature=TEMPERATURE,
        passes=Passes(max_logit_bytes=max_logit_bytes, pack=share_prompts),
    )
    model.load_state_dict(moved)  # after the reference was copied from the start
    groups = [
        ScoredGroup(
            PROMPTS[g],
            tuple(COMPLETIONS[g * GROUP : (g + 1) * GROUP]),
            tuple(behaviour[g * GROUP : (g + 1) * GROUP]),
            tuple(REWARDS[g * GROUP : (g + 1) * GROUP]),
        )
        for g in range(len(PROMPTS))
    ]
    batch = Batch.of(groups, objective)
    model.train()
    model.zero_grad()
    loss, _ = trainer.backward(batch, range(batch.rows))
    return loss, grad_norm(model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_our_loss_and_gradient_equal_trl_s(variant, start, tmp_path, record_property):
    settings = {"delta": 3.0, **VARIANTS[variant]}  # delta: our --ratio-cap, always on
    trl = trl_loss(start, settings, tmp_path)
    echo = echo_loss(start, ours(settings))
    # bench/vs_trl.py reports these (its objective_parity, from --junitxml).
    record_property("abs_delta_loss", abs(echo[0] - trl[0]))
    record_property("abs_delta_grad_norm", abs(echo[1] - trl[1]))
    assert abs(echo[0] - trl[0]) <= 1e-5, (echo, trl)
    assert abs(echo[1] - trl[1]) <= 1e-5 * max(1.0, trl[1]), (echo, trl)
    # Split into one row per forward pass (the logit memory budget), the same.
    split = echo_loss(start, ours(settings), max_logit_bytes=1)
    assert split == pytest.approx(echo, rel=1e-5, abs=1e-6)
    # Whole rows, as the ranks of --train-procs run them: the same.
    rows = echo_loss(start, ours(settings), share_prompts=False)
    assert rows == pytest.approx(echo, rel=1e-5, abs=1e-6)


def test_the_variants_differ(start):
    """A check on the check: the variants give different losses on this batch,
    so their equality with TRL's is not an accident of a batch on which all agree."""
    losses = [echo_loss(start, ours({"delta": 3.0, **settings}))[0] for settings in VARIANTS.values()]
    assert min(abs(a - b) for i, a in enumerate(losses) for b in losses[i + 1 :]) > 1e-4, losses
