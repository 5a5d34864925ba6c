"""Policies that log-prob checks are run against: the built-in model as
initialised, taught the reverse task to near-determinism, and with every
weight doubled and tripled (huge activations: the hardest case for rounding
we found). A check that passes on the untrained model alone says little: its
tokens are all near-uniform, so no rounding moves a log-prob far.

tests/node/test_llama_backend.py, tests/test_gpu.py and bench/gpu.py use them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from echo_learner.training.model import ModelShape, build_model

EOS = 258


def sharpened(seed: int) -> torch.nn.Module:
    """A version with near-certain and unlikely tokens (every weight x (1 + seed))."""
    model = build_model(ModelShape(seed=seed))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.0 + seed)
    return model.eval()


def reverse_trained(steps: int = 300) -> torch.nn.Module:
    """The built-in model taught the reverse task to near-determinism
    (supervised, 11 s on 2 cores): as sharp as a policy after thousands of
    GRPO steps."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(steps):
        rows = []
        for _ in range(64):
            s = [rng.randrange(97, 101) for _ in range(3)]
            rows.append([257, *s, 61, *s[::-1], EOS])
        ids = torch.tensor(rows)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def policies(trained: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """Initial, ``trained`` (``reverse_trained``), doubled and tripled."""
    yield "initial", build_model().eval()
    yield "trained", trained
    yield "x2", sharpened(1)
    yield "x3", sharpened(2)
