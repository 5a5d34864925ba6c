"""A real GRPO step on the real default model moves probability the right way."""

import torch

from echo_learner.training.model import build_model, build_tokenizer, config_json, tokenizer_digest
from echo_learner.training.trainer import Objective, Passes, ScoredGroup, Trainer
from echo_node.backend_torch import TorchBackend

OBJ = Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.0)


def token_logprobs(model, prompt, completion) -> tuple[float, ...]:
    with torch.no_grad():
        ids = torch.tensor([list(prompt) + list(completion)])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
    return tuple(logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(completion))


def sequence_logprob(model, prompt, completion):
    return sum(token_logprobs(model, prompt, completion))


def test_default_model_and_tokenizer_are_deterministic():
    a, b = build_model(), build_model()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    tok = build_tokenizer()
    assert tok("ab=", add_special_tokens=False)["input_ids"] == [97, 98, 61]
    assert tokenizer_digest(tok) == tokenizer_digest(build_tokenizer())


def test_step_raises_the_rewarded_completion():
    torch.manual_seed(0)
    model = build_model()
    trainer = Trainer(model, lr=1e-2, objective=OBJ, pad_id=256)
    prompt = (257, 97, 98, 99, 61)
    good, bad = (99, 98, 97, 258), (97, 97, 97, 258)
    with torch.no_grad():
        before = sequence_logprob(model, prompt, good) - sequence_logprob(model, prompt, bad)

    behaviour = (token_logprobs(model, prompt, good), token_logprobs(model, prompt, bad))
    group = ScoredGroup(prompt, (good, bad), behaviour, (1.0, 0.0))
    for _ in range(3):
        trainer.step([group])
    with torch.no_grad():
        after = sequence_logprob(model, prompt, good) - sequence_logprob(model, prompt, bad)
    assert after > before + 0.1


def test_a_prompt_answered_wrong_with_certainty_is_pushed_down_only_when_asked():
    """Every group scored its completions alike: GRPO learns nothing and the
    step is skipped; with ``push_down_flat`` the group below the step's mean
    loses probability."""
    prompt, wrong = (257, 97, 98, 99, 61), (99, 99, 97, 258)  # "abc=" answered "cca" (2 of 3 right)
    other, solved = (257, 97, 97, 98, 61), (98, 97, 97, 258)

    for push_down_flat in (False, True):
        torch.manual_seed(0)
        model = build_model()
        objective = Objective(clip_eps=0.2, ratio_cap=3.0, kl_coef=0.0, push_down_flat=push_down_flat)
        trainer = Trainer(model, lr=1e-2, objective=objective, pad_id=256)
        before = token_logprobs(model, prompt, wrong)
        flat_wrong = ScoredGroup(prompt, (wrong,) * 4, (before,) * 4, (2 / 3,) * 4)
        flat_right = ScoredGroup(other, (solved,) * 4, (token_logprobs(model, other, solved),) * 4, (1.0,) * 4)
        stats = trainer.step([flat_wrong, flat_right])
        after = token_logprobs(model, prompt, wrong)
        if push_down_flat:
            assert stats.tokens > 0 and sum(after) < sum(before) - 0.05
        else:
            assert stats.tokens == 0 and after == before


def test_a_step_split_to_fit_its_memory_budget_equals_one_pass():
    """Long answers: a batch whose logits exceed --logit-memory-mib is trained
    in parts, each weighted by its share of the tokens: the same step."""
    from echo_learner.training.logprobs import TRAIN_BYTES_PER_LOGIT

    g = torch.Generator().manual_seed(3)

    def rand(n, lo, hi):
        return tuple(int(x) for x in torch.randint(lo, hi, (n,), generator=g))

    groups = []
    for p in range(3):
        prompt = (257, *rand(2 + p, 97, 101), 61)
        completions = tuple(rand(int(torch.randint(1, 25, (1,), generator=g)), 0, 259) for _ in range(4))
        behaviour = tuple(tuple(-2.0 for _ in c) for c in completions)
        rewards = tuple(float(x) for x in torch.rand(4, generator=g))
        groups.append(ScoredGroup(prompt, completions, behaviour, rewards))
    results = []
    for budget in (2**30, 2 * 30 * 259 * TRAIN_BYTES_PER_LOGIT):  # everything at once; about two rows a pass
        model = build_model()
        trainer = Trainer(
            model, lr=1e-3, objective=OBJ, pad_id=256, passes=Passes(max_logit_bytes=budget), temperature=0.8
        )
        stats = trainer.step(groups)
        # The gradient, not the weights: Adam's first step is about lr x its
        # sign, which rounding flips where it is near 0.
        results.append((stats, {name: p.grad.clone() for name, p in model.named_parameters()}))
    (one, grads_one), (split, grads_split) = results
    assert abs(one.loss - split.loss) < 1e-5 and one.tokens == split.tokens > 0
    assert any(g.abs().max() > 1e-4 for g in grads_one.values())
    assert all(torch.allclose(grads_one[k], grads_split[k], atol=1e-6, rtol=1e-4) for k in grads_one)


def test_published_weights_load_into_a_node_backend():
    model = build_model()
    trainer = Trainer(model, lr=1e-3, objective=OBJ, pad_id=256)
    backend = TorchBackend(threads=1)
    backend.load(config_json(model), trainer.weights())
    groups = backend.generate([(257, 97, 98, 99, 61)], group_size=4, max_new_tokens=4, temperature=1.0, stop_ids=(258,))
    assert len(groups) == 1 and len(groups[0]) == 4
    for sample in groups[0]:
        assert 1 <= len(sample.tokens) <= 4 and len(sample.logprobs) == len(sample.tokens)
        assert all(lp <= 0 for lp in sample.logprobs)
        # The node's log-probs are the learner's model's log-probs for the same tokens.
        with torch.no_grad():
            ids = torch.tensor([[257, 97, 98, 99, 61, *sample.tokens]])
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
        ref = [lp[4 + j, t].item() for j, t in enumerate(sample.tokens)]
        assert max(abs(a - b) for a, b in zip(ref, sample.logprobs)) < 1e-4


def test_a_step_without_signal_leaves_weights_and_optimiser_alone():
    model = build_model()
    trainer = Trainer(model, lr=1e-2, objective=OBJ, pad_id=256)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompt = (257, 97, 61)
    same = ScoredGroup(prompt, ((97, 258), (98, 258)), ((-1.0, -1.0), (-1.0, -1.0)), (1.0, 1.0))
    stats = trainer.step([same, same])
    assert stats.tokens == 0 and stats.reward_mean == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert trainer.optimizer.state_dict()["state"] == {}
