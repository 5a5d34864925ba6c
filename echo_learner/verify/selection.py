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
against choosing; one that solves much, for it.

Twins (``echo_learner.swarm.pool``: one prompt handed to two peers) say more: the
other peer's group tells how hard this very prompt is, so each group of the
pair is weighed against the beta updated with the other's count (a
simulation of SmolLM2-like prompts, Beta(0.5, 1): the best of 8 adds ~0.4
nats a paired group against ~0.11 unpaired; an honest one, -0.35). A twin
counts once both groups are in, for both peers, and only side by side: not
also against the other peers' groups. docs/learner.md has what it takes to
catch the best of 8.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass
from functools import lru_cache

SUCCESS = 0.5  # a completion's reward that counts as a success
DESIGN_TRIES = 4  # the alternative: the best of this many groups
GRID = 200  # points of the quadrature over a prompt's chance of success
# What a prompt's chance of success is taken to be before the other peers'
# groups fit one (Jeffreys' prior): a twin's count then does most of the work.
UNFITTED = (0.5, 0.5)


@dataclass(frozen=True)
class Group:
    """One group's score, and whose it is (``row``: the caller's tag for the
    evidence it feeds, handed back with the group's ratio)."""

    peer: str
    row: object
    version: int
    successes: int
    size: int


class RewardReference:
    """The success counts of recent groups, by version and peer (``lag``
    versions back: a stale batch still finds its own version's): what a
    peer's groups are weighed against. A group that is no twin is weighed
    against other peers' groups of its version once there are ``least`` of
    them: a big swarm answers a version's prompts many times over; in a
    small one, twins carry the test."""

    def __init__(self, *, lag: int = 16, keep: int = 256, least: int = 16):
        self.lag = lag
        self.least = least  # other peers' groups needed to fit the model
        self.keep = keep
        self.groups: dict[int, deque[tuple[str, int, int]]] = defaultdict(lambda: deque(maxlen=keep))
        # Twins' firsts in, their seconds not yet (bounded: the oldest go).
        self.waiting: OrderedDict[int, Group] = OrderedDict()

    def likelihood_ratios(
        self, peer: str, row: object, version: int, groups: list[list[float]], twins: list[int | None]
    ) -> list[tuple[Group, float]]:
        """The log-likelihood ratios, chosen over drawn, that ``peer``'s
        groups of ``version`` (each a list of its completions' rewards; the
        twin pair each belongs to, or None) settle: each group that is no
        twin against other peers' groups (none while there are too few of
        them, or they all scored alike); each pair completed now, both its
        groups side by side (the first's may be another peer's). Then the
        groups are remembered for other peers."""
        scored = [Group(peer, row, version, sum(r >= SUCCESS for r in g), len(g)) for g in groups]
        # Each fit only where a group needs it: this runs for every accepted batch.
        prior = self._prior(peer, version) if None in twins else None
        twins_prior = self._twins_prior(version) if any(t is not None for t in twins) else UNFITTED
        ratios = []
        for group, twin in zip(scored, twins):
            if twin is None:
                if prior is not None:
                    ratios.append((group, log_ratio(group.successes, group.size, *prior)))
                continue
            first = self.waiting.pop(twin, None)
            if first is None:
                self.waiting[twin] = group
                while len(self.waiting) > self.keep:
                    self.waiting.popitem(last=False)
            elif first.peer != peer and first.version == version:
                ratios += [
                    (first, side_by_side(first, group, twins_prior)),
                    (group, side_by_side(group, first, twins_prior)),
                ]
        self.groups[version].extend((peer, g.successes, g.size) for g in scored)
        for old in [v for v in self.groups if v < version - self.lag or v > version + 1]:
            del self.groups[old]
        return ratios

    def _prior(self, peer: str, version: int) -> tuple[float, float] | None:
        """The beta of prompts' chance of success fitted to other peers'
        groups of ``version`` (None: too few). Of that version only: older
        ones scored lower while the policy learned, and against them honest
        peers of a fast-learning job looked chosen (tests/net/test_nat.py)."""
        others = [(c, n) for p, c, n in self.groups.get(version, ()) if p != peer]
        return beta_of(others) if len(others) >= self.least else None

    def _twins_prior(self, version: int) -> tuple[float, float]:
        """The beta of prompts' chance of success fitted to every peer's
        groups of ``version`` and as many versions before it as it takes to
        have ``least`` of them (``UNFITTED`` if there are fewer). A twin's
        count weighs more than this prior, and it weighs both groups of a
        pair alike, so a prior from older versions (scoring lower while the
        policy learns) shifts no peer against the other; a fitted one, rather
        than ``UNFITTED``, catches the best of 8 in ~0.6 times the groups."""
        groups: list[tuple[int, int]] = []
        for v in range(version, version - self.lag - 1, -1):
            groups += [(c, n) for _, c, n in self.groups.get(v, ())]
            if len(groups) >= self.least:
                return beta_of(groups) or UNFITTED
        return UNFITTED


def side_by_side(group: Group, twin: Group, prior: tuple[float, float]) -> float:
    """``group``'s log-likelihood ratio, chosen over drawn, for a prompt whose
    chance of success is ``prior`` updated with ``twin``'s count."""
    a, b = prior
    return log_ratio(
        group.successes, group.size, round(a + twin.successes, 3), round(b + twin.size - twin.successes, 3)
    )


def beta_of(groups: list[tuple[int, int]]) -> tuple[float, float] | None:
    """The beta distribution of the prompts' chance of success that gives
    ``groups`` (successes, completions) their mean and spread (method of
    moments), rounded for the cache; None when the groups all scored alike.

    The beta is never surer of the mean than ``groups`` can make it (a + b
    at most their number): fitted to few groups whose spread came out below
    the binomial's, it was otherwise near a binomial at a mean known to
    +-0.1, and every group of an honest peer above that mean weighed ~+1
    nat."""
    shares = [c / n for c, n in groups]
    n = sum(size for _, size in groups) / len(groups)
    mean = sum(shares) / len(shares)
    if not 0.01 < mean < 0.99:
        return None
    spread = sum((s - mean) ** 2 for s in shares) / len(shares)
    binomial = mean * (1 - mean) / n
    # The extra spread prompts' difficulty adds: rho = 1 / (a + b + 1).
    rho = min(max((spread / binomial - 1) / max(n - 1, 1), 1e-3), 0.999)
    total = min(1 / rho - 1, len(groups))
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
