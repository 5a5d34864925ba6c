"""Groups chosen for their rewards: how likely a group's score is if it is the
best of several, against if it is the one drawn.

A node that generates several groups for a prompt and sends the one that
scores best sends honest tokens (every per-token test passes), but the group
is no sample of the policy, and the learner trains on it as if it were.
What gives it away is the score itself, over many groups: every peer's
prompts are drawn alike, so a peer whose groups keep scoring above the
others' is choosing them.

Prompts differ far more in difficulty than the choice moves a group's score
(SmolLM2 on two-term sums: most prompts are right 0-2 times in 8, a few 6-8;
the best of 8 groups scored only 0.76 standard deviations above the others),
so a plain comparison of means needs many groups. The test here is the
likelihood ratio of a group's count of successful completions (reward >=
``SUCCESS``) under two models fitted to the other peers' recent groups: the
counts of a beta-binomial (each prompt has its own chance of success, drawn
from a beta fitted by moments), against the best of ``DESIGN_TRIES`` such
counts for the same prompt. A group that solves nothing is strong evidence
against choosing; one that solves much, for it. docs/learner.md has what it
takes to catch the best of 8.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from functools import lru_cache

SUCCESS = 0.5  # a completion's reward that counts as a success
DESIGN_TRIES = 4  # the alternative: the best of this many groups
GRID = 200  # points of the quadrature over a prompt's chance of success


class RewardReference:
    """The success counts of recent groups, by version and peer: what a
    peer's groups are weighed against. Other peers' groups of the same
    version, and of as many versions before it as it takes to have
    ``least`` of them (at most ``lag`` versions back): a big swarm answers a
    version's prompts many times over, a small one a few times."""

    def __init__(self, *, lag: int = 16, keep: int = 256, least: int = 16):
        self.lag = lag
        self.least = least  # other peers' groups needed to fit the model
        self.groups: dict[int, deque[tuple[str, int, int]]] = defaultdict(lambda: deque(maxlen=keep))

    def likelihood_ratios(self, peer: str, version: int, groups: list[list[float]]) -> list[float]:
        """The log-likelihood ratio, chosen over drawn, of each of ``peer``'s
        groups of ``version`` (each a list of its completions' rewards), from
        other peers' groups ([] while there are too few of them, or they all
        scored alike); then they are remembered for other peers."""
        counts = [(sum(r >= SUCCESS for r in g), len(g)) for g in groups]
        others: list[tuple[int, int]] = []
        for v in range(version, version - self.lag - 1, -1):
            others += [(c, n) for p, c, n in self.groups.get(v, ()) if p != peer]
            if len(others) >= self.least:
                break
        ratios = []
        if len(others) >= self.least:
            prior = beta_of(others)
            if prior is not None:
                ratios = [log_ratio(c, n, *prior) for c, n in counts]
        self.groups[version].extend((peer, c, n) for c, n in counts)
        for old in [v for v in self.groups if v < version - self.lag or v > version + 1]:
            del self.groups[old]
        return ratios


def beta_of(groups: list[tuple[int, int]]) -> tuple[float, float] | None:
    """The beta distribution of the prompts' chance of success that gives
    ``groups`` (successes, completions) their mean and spread (method of
    moments), rounded for the cache; None when the groups all scored alike."""
    shares = [c / n for c, n in groups]
    n = sum(size for _, size in groups) / len(groups)
    mean = sum(shares) / len(shares)
    if not 0.01 < mean < 0.99:
        return None
    spread = sum((s - mean) ** 2 for s in shares) / len(shares)
    binomial = mean * (1 - mean) / n
    # The extra spread prompts' difficulty adds: rho = 1 / (a + b + 1).
    rho = min(max((spread / binomial - 1) / max(n - 1, 1), 1e-3), 0.999)
    total = 1 / rho - 1
    return round(mean * total, 3), round((1 - mean) * total, 3)


@lru_cache(maxsize=4096)
def log_ratio(successes: int, size: int, a: float, b: float) -> float:
    """log P(best of DESIGN_TRIES groups has ``successes``) / P(one group has
    it), for groups of ``size`` completions of a prompt whose chance of
    success is Beta(a, b)."""
    chosen = drawn = 0.0
    weights = [math.exp((a - 1) * math.log(q) + (b - 1) * math.log1p(-q)) for q in _grid()]
    total = sum(weights)
    for q, w in zip(_grid(), weights):
        below = _cdf(successes - 1, size, q)
        at_most = below + math.comb(size, successes) * q**successes * (1 - q) ** (size - successes)
        chosen += w * (at_most**DESIGN_TRIES - below**DESIGN_TRIES)
        drawn += w * (at_most - below)
    return math.log(max(chosen / total, 1e-300) / max(drawn / total, 1e-300))


@lru_cache(maxsize=1)
def _grid() -> tuple[float, ...]:
    return tuple((i + 0.5) / GRID for i in range(GRID))


def _cdf(k: int, n: int, q: float) -> float:
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))
