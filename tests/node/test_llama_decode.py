"""Sampling in llama.cpp's decode graph, and continuous batching
(echo_node/llama_decode.py): exact draws from softmax(logits / T), exact
log-probs, and the same samples however the sequences share the batch."""

import math
from collections import Counter

import pytest
import torch

from echo_learner.training.model import build_model
from echo_node.backend_choice import llama_installed
from echo_node.llama_decode import Generation
from tests.node.test_llama_backend import EOS, llama, sharpened

pytestmark = pytest.mark.skipif(
    not llama_installed(), reason="llama.cpp not installed: pip install -e '.[llama]' (make test does)"
)
PROMPT = (257, 97, 98, 61)
# A near-uniform model stops after ~13 tokens on average with these, so
# answers of 1 to 24 tokens mix in one batch.
STOPS = (EOS, *range(100, 120))


def chi_square(counts: Counter, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic of ``counts`` against ``probs`` (outcomes expected
    fewer than 5 times pooled into one bin) and its critical value at
    p = 1e-4 (Wilson-Hilferty)."""
    n = sum(counts.values())
    expected = probs * n
    big = expected >= 5
    stat = sum((counts.get(t, 0) - e) ** 2 / e for t, e in enumerate(expected.tolist()) if big[t])
    rest_expected = expected[~big].sum().item()
    if rest_expected > 0:
        rest = sum(c for t, c in counts.items() if not big[t])
        stat += (rest - rest_expected) ** 2 / rest_expected
    df = int(big.sum()) + (rest_expected > 0) - 1
    z = 3.719  # one-sided normal quantile of 1e-4
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_draws_follow_softmax_of_the_scaled_logits(tmp_path):
    """A chi-square test over 8,192 first tokens of a sharp model at T = 0.7,
    which fails against the distribution at T = 1 (a sampler that ignored
    the temperature would pass nothing)."""
    model = sharpened(1)
    backend = llama("f32", tmp_path, model)
    temperature = 0.7
    firsts = Counter(
        s.tokens[0] for _ in range(2) for g in backend.generate([PROMPT] * 64, 64, 1, temperature, ()) for s in g
    )
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1].double()
    stat, critical = chi_square(firsts, torch.softmax(logits / temperature, -1))
    print(f"chi-square {stat:.1f}, critical {critical:.1f}, {len(firsts)} distinct tokens")
    assert stat < critical
    wrong, critical = chi_square(firsts, torch.softmax(logits, -1))
    assert wrong > critical


def test_logprobs_are_those_of_a_float64_reference(tmp_path):
    """Every sampled token's log-prob within 1e-4 of log_softmax(logits / T)
    computed in float64 from the same f32 weights."""
    model = sharpened(2)
    backend = llama("f32", tmp_path, model)
    worst, tokens = 0.0, 0
    for temperature in (0.6, 1.0, 1.3):
        groups = backend.generate([PROMPT], 8, 12, temperature, (EOS,))
        for s in groups[0]:
            ids = torch.tensor([PROMPT + s.tokens])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1].double() / temperature
            reference = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.tokens)[:, None]).squeeze(-1)
            worst = max(worst, (reference - torch.tensor(s.logprobs, dtype=torch.float64)).abs().max().item())
            tokens += len(s.tokens)
    print(f"{tokens} tokens, worst |llama.cpp - float64| {worst:.2e}")
    assert tokens > 100 and worst < 1e-4


def generate(backend, prompts, *, max_sequences, continuous=True, seed=7):
    generation = Generation(
        backend.loaded.ctx,
        n_ctx=backend.loaded.n_ctx,
        max_sequences=max_sequences,
        prompts=prompts,
        group_size=4,
        max_new_tokens=24,
        temperature=1.0,
        stop_ids=STOPS,
        seed=seed,
        continuous=continuous,
    )
    return generation.run(), generation.timing


def test_sequences_come_out_the_same_however_they_share_the_batch(tmp_path):
    """Answers of different lengths: continuous batching (slots freed by short
    answers go to waiting groups), chunked batching and one group at a time
    give the same samples for the same seed."""
    backend = llama("f32", tmp_path, build_model())
    prompts = [(257, 97 + i % 4, 98, 61) for i in range(12)]
    continuous, timing = generate(backend, prompts, max_sequences=16)
    lengths = {len(s.tokens) for g in continuous for s in g}
    assert len(lengths) > 3  # the stop tokens end answers at many lengths
    chunked, chunked_timing = generate(backend, prompts, max_sequences=16, continuous=False)
    one_by_one, _ = generate(backend, prompts, max_sequences=4)
    for a, b, c in zip(continuous, chunked, one_by_one):
        for x, y, z in zip(a, b, c):
            assert x.tokens == y.tokens == z.tokens
            assert max(abs(p - q) for p, q in zip(x.logprobs + (0,), z.logprobs + (0,))) < 1e-5
    # Freed slots were refilled: fewer decode steps than waiting for each chunk to end.
    assert timing.steps < chunked_timing.steps
    # Another seed, other samples.
    other, _ = generate(backend, prompts, max_sequences=16, seed=8)
    assert [s.tokens for g in other for s in g] != [s.tokens for g in continuous for s in g]
