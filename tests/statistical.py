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
    return binned_fit(draws, cuts, expected)


def discrete_gaussian_fits(draws: list[int], sigma: float) -> bool:
    """Chi-square fit of integer draws to the discrete Gaussian P(k) ∝ exp(-k²/2σ²),
    binned at multiples of σ/4 with sparse tails pooled.

    Bin masses are summed exactly for small σ; for σ > 50 they are the normal CDF
    between half-integers, which differs from the discrete Gaussian's by less than
    e^(-2π²σ²) (Poisson summation): far below what 20,000 draws can see.
    """
    cuts = sorted({math.floor(sigma * t / 4) for t in range(-16, 17)})
    expected = [0.0] * (len(cuts) + 1)
    if sigma > 50:
        edges = [-math.inf, *(c + 0.5 for c in cuts), math.inf]
        for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
            mass = stats.norm.cdf(hi, scale=sigma) - stats.norm.cdf(lo, scale=sigma)
            expected[i] = len(draws) * mass
    else:
        support = range(-int(12 * sigma) - 10, int(12 * sigma) + 11)
        weights = [math.exp(-(k * k) / (2 * sigma * sigma)) for k in support]
        norm = math.fsum(weights)
        for k, w in zip(support, weights, strict=True):
            expected[bisect.bisect_left(cuts, k)] += len(draws) * w / norm
    return binned_fit(draws, cuts, expected)


def binned_fit(draws: list[int], cuts: list[int], expected: list[float]) -> bool:
    """Chi-square test of integer draws against the ``expected`` count in each bin (cut at
    ``cuts``), bins expecting fewer than 5 pooled: whether it passes at ``SIGNIFICANCE``."""
    observed = [0] * len(expected)
    for d in draws:
        observed[bisect.bisect_left(cuts, d)] += 1
    keep = [i for i, e in enumerate(expected) if e >= 5]
    rest = [i for i in range(len(expected)) if i not in keep]
    obs = [observed[i] for i in keep] + ([sum(observed[i] for i in rest)] if rest else [])
    exp_ = [expected[i] for i in keep] + ([sum(expected[i] for i in rest)] if rest else [])
    _, pvalue = stats.chisquare(obs, exp_, sum_check=False)
    return pvalue > SIGNIFICANCE
