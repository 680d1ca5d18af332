"""Debiasing randomized response (``sql/randomized.py`` decides which aggregates are
debiased): post-processing of the noisy measurements, which costs no privacy and
leaves the central noise unchanged (the rule and its proof:
``dpmagic/gate/dp/randomized_response.py``). Each kind that is debiased applies its
estimator here (``Aggregate.debias``). An estimate's interval is a *normal
approximation*: the randomization's standard deviation (a plug-in estimate, see the
functions below) times the normal quantile, combined in quadrature with the central
noise's own (OpenDP) half-width of the same linear combination. Quadrature is exact
for normal errors and gives the noise's own interval when the randomization is
negligible; for the sum of a normal and Laplace errors of any relative size it was
checked by simulation to cover at least the nominal 95%.
``tests/unit/test_randomized_response.py`` measures the coverage of the whole
pipeline. Each row's answer is assumed randomized independently of every other
row's, as the survey design declares."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from statistics import NormalDist

import numpy as np

from dpmagic.gate.dp.randomized_response import random_share, true_count, true_sum
from dpmagic.gate.sql.aggregates.func import AggregateFunc

# A noisy measurement's values, one per partition: a list, or the noise pass's array.
Values = Sequence[int | float] | np.ndarray


class Debiasing(Enum):
    """How a kind over a randomized-response column is debiased (``randomized``)."""

    # Grouped by the column, per answer; ungrouped, it counts answers given, which
    # the randomization leaves alone (``COUNT(*)``, ``COUNT(column)``).
    PER_ANSWER = "per answer"
    # From the expectation of each report, over numeric public values (``SUM``, ``AVG``).
    PER_VALUE = "per value"


@dataclass(frozen=True)
class Debias:
    """One aggregate over a randomized-response column: what undoes the randomization.

    ``func`` is count (grouped by the column, whose position among the group
    keys is ``key``), sum or avg; ``k`` is the number of public values, and
    ``numbers`` are those values for sums and averages.
    """

    func: AggregateFunc  # COUNT, SUM or AVG
    p: float
    k: int
    key: int | None = None
    numbers: tuple[float, ...] = ()

    @property
    def mean(self) -> float:
        """The expected value of a uniformly random answer."""
        return sum(self.numbers) / self.k

    @property
    def spread(self) -> float:
        """The variance of a uniformly random answer."""
        return sum((v - self.mean) ** 2 for v in self.numbers) / self.k

    @property
    def lo(self) -> float:
        return min(self.numbers)

    @property
    def hi(self) -> float:
        return max(self.numbers)


@dataclass(frozen=True)
class Debiased:
    """One debiased aggregate over every partition, and what its interval needs.

    ``random_sd`` is the randomization's standard deviation of each estimate;
    ``gains`` weigh the central noise's half-widths of the aggregate's first and
    second measurement (for counts: the count vector; for sums and averages:
    the sum and the count) in the estimate. ``clip`` bounds every value and
    interval (counts are at least 0, averages within the public values).
    """

    values: list[float]
    random_sd: list[float]
    gains: list[tuple[float, float]]
    clip: tuple[float, float]

    def interval(
        self, pid: int, alpha: float, half_widths: tuple[float, float]
    ) -> tuple[float, float]:
        """A normal-approximation (1-alpha) interval: the randomization's normal
        half-width and the central noise's exact one, added in quadrature."""
        z = NormalDist().inv_cdf(1 - alpha / 2)
        (g1, g2), (h1, h2) = self.gains[pid], half_widths
        noise = math.hypot(g1 * h1, g2 * h2)
        sd = self.random_sd[pid]
        half = math.inf if math.isinf(sd) else math.hypot(z * sd, noise)
        value = self.values[pid]
        lo, hi = self.clip
        return min(max(value - half, lo), hi), min(max(value + half, lo), hi)


def answers(counts: Values | None) -> Values:
    """How many answers a debiased sum or mean adds up, which the plan measures with it."""
    if counts is None:
        raise RuntimeError("internal error: the count a debiased sum or mean is over is missing")
    return counts


def counts(d: Debias, counts: Values, groups: list[list[int]]) -> Debiased:
    """``t_v = (c_v − r·n)/p`` in each group, ``n`` its noisy total, ``r = (1−p)/k``."""
    r = random_share(d.p, d.k)
    own = (1 - r) / d.p  # the weight of c_v's noise in t_v; each other count's is r/p
    gain = math.sqrt(own * own + (d.k - 1) * (r / d.p) ** 2)
    values = [0.0] * len(counts)
    sds = [0.0] * len(counts)
    for group in groups:
        n = max(sum(counts[i] for i in group), 0.0)
        for i in group:
            t = true_count(counts[i], n, d.p, d.k)
            values[i] = t
            sds[i] = math.sqrt(_count_variance(t, n, d.p, r)) / d.p
    return Debiased(values, sds, [(gain, 0.0)] * len(counts), (0.0, math.inf))


def _count_variance(t: float, n: float, p: float, r: float) -> float:
    """The variance of the reported count of a value that ``t`` of ``n`` respondents
    hold: each holder reports it with chance p + r, each other respondent with r."""
    t = min(max(t, 0.0), n)
    return t * (p + r) * (1 - p - r) + (n - t) * r * (1 - r)


def sums(d: Debias, sums: Values, counts: Values) -> Debiased:
    values, sds, gains = [], [], []
    for s, c in zip(sums, counts, strict=True):
        n = max(c, 0.0)
        total = true_sum(s, c, d.p, d.mean)
        values.append(total)
        sds.append(math.sqrt(_sum_variance(d, total / n if n >= 1 else d.mean, n)) / d.p)
        gains.append((1 / d.p, (1 - d.p) * abs(d.mean) / d.p))
    return Debiased(values, sds, gains, (-math.inf, math.inf))


def averages(d: Debias, sums: Values, counts: Values) -> Debiased:
    values, sds, gains = [], [], []
    for s, c in zip(sums, counts, strict=True):
        n = max(c, 1.0)
        mean = (s / n - (1 - d.p) * d.mean) / d.p
        values.append(min(max(mean, d.lo), d.hi))
        # With under one noisy answer, nothing is known beyond the public values.
        sd = math.sqrt(_sum_variance(d, mean, n)) / (d.p * n) if c >= 1 else math.inf
        sds.append(sd)
        gains.append((1 / (d.p * n), abs(s) / (d.p * n * n)))
    return Debiased(values, sds, gains, (d.lo, d.hi))


def _sum_variance(d: Debias, mean: float, n: float) -> float:
    """An upper bound on the variance of a sum of ``n`` reports whose true values
    have mean ``mean``.

    A report of true value x has variance p(1−p)(x−m)² + (1−p)s², with m and s²
    the mean and variance of a random answer. The sum of (x−m)² over the true
    values is at most n·((hi−x̄)(x̄−lo) + (x̄−m)²) (the Bhatia–Davis bound on
    their variance given their mean x̄), which is exact for two public values.
    """
    x = min(max(mean, d.lo), d.hi)
    squares = n * ((d.hi - x) * (x - d.lo) + (x - d.mean) ** 2)
    return d.p * (1 - d.p) * squares + n * (1 - d.p) * d.spread
