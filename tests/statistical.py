"""Statistical checks of randomized mechanisms, shared by the tests of the noise: each
states its error rate, so a test built on it says how often a correct mechanism fails."""

from __future__ import annotations

import bisect
import itertools
import math

from scipy import stats

SIGNIFICANCE = 1e-4


def discrete_laplace_fits(draws: list[int], scale: float) -> bool:
    """Chi-square goodness of fit of integer draws to discrete Laplace(scale).

    Bins are integer ranges cut at multiples of the scale (so the test works
    for a scale of 0.7 grid units as for one of 10**7), the tails pooled.
    """
    p = math.exp(-1 / scale)

    def cdf(k: float) -> float:  # P(X <= k) for integer k
        return 1 - p ** (k + 1) / (1 + p) if k >= 0 else p ** (-k) / (1 + p)

    cuts = sorted({math.floor(scale * t / 4) for t in range(-16, 17)})
    edges = [-math.inf, *cuts, math.inf]
    expected = [
        len(draws) * ((1.0 if hi == math.inf else cdf(hi)) - (0.0 if lo == -math.inf else cdf(lo)))
        for lo, hi in itertools.pairwise(edges)
    ]
    observed = [0] * len(expected)
    for d in draws:
        observed[bisect.bisect_left(cuts, d)] += 1
    keep = [i for i, e in enumerate(expected) if e >= 5]
    rest = [i for i in range(len(expected)) if i not in keep]
    obs = [observed[i] for i in keep] + ([sum(observed[i] for i in rest)] if rest else [])
    exp_ = [expected[i] for i in keep] + ([sum(expected[i] for i in rest)] if rest else [])
    _, pvalue = stats.chisquare(obs, exp_, sum_check=False)
    return pvalue > SIGNIFICANCE
