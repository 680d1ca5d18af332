"""Quantiles (MIN, MAX, MEDIAN, percentiles) by the exponential mechanism.

The released value is one of a public grid of candidates spanning the
declared bounds, chosen by OpenDP's noisy max (``make_noisy_max``, Gumbel
noise) over the scores of ``dp.quantiles``: each candidate's distance, in
ranks, from being a true quantile of its group, counting the values at the
candidate (OpenDP's own quantile score leaves them out, and misses the true
quantile where many values share one candidate). Each value is first
snapped to its nearest candidate, so the data enters only as a histogram
over candidate *indices*: the generated SQL counts rows per index. The
scores' sensitivity is ``dp.quantiles``' rule (the same number OpenDP's map
gives its own score); the mechanism's privacy map is OpenDP's.

A privacy unit changes the multiset of indices of each partition it touches;
over all partitions the symmetric distance is at most ``distance``. The
privacy loss of selecting in every partition is linear in the distance, so
it is at most ``distance`` times the ε for a distance of one.

Accuracy is stated in ranks, the only currency the mechanism's guarantee is
in (``QuantileNoise.rank_radius``); a quantile's interval in the column's
units spends more budget on two more selections (``sql/edges.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from opendp import measurements
from opendp.domains import atom_domain, vector_domain
from opendp.measures import max_divergence
from opendp.metrics import linf_distance
from opendp.mod import Measurement, enable_features

from dpmagic.gate.dp.quantiles import quantile_scores, score_sensitivity

enable_features("contrib")

EXPONENTIAL = "exponential"
GRID_POINTS = 1001  # candidates over a float range, or an int range wider than this
_U64_MAX = 2**64 - 1
_ALPHA_DEN = 10_000  # OpenDP's finest quantile granularity when the size is unknown


@dataclass(frozen=True)
class Grid:
    """Candidates ``lo + i*step`` for ``i`` in ``range(size)``, the last one capped at
    ``hi``: every released value lies within the declared bounds."""

    lo: float
    hi: float
    step: float
    size: int
    integral: bool

    def value(self, index: int) -> int | float:
        v = min(self.lo + index * self.step, self.hi)
        return int(v) if self.integral else v


def grid(lo: float, hi: float, integral: bool) -> Grid:
    if integral:
        low, high = math.floor(lo), math.ceil(hi)
        whole = max(1, math.ceil((high - low) / (GRID_POINTS - 1)))
        return Grid(low, high, whole, -(-(high - low) // whole) + 1, True)
    step = (hi - lo) / (GRID_POINTS - 1)
    if not (step > 0 and math.isfinite(step)):
        # One point, or bounds so far out that doubles cannot tell their steps apart.
        return Grid(lo, hi, 1.0, 1, False)
    return Grid(lo, hi, step, GRID_POINTS, False)


@dataclass(frozen=True)
class QuantileNoise:
    """The exponential mechanism for one quantile level over ``size`` candidates."""

    level: float
    size: int
    distance: int  # symmetric distance one unit can cause, summed over partitions
    scale: float

    @property
    def mechanism(self) -> str:
        return EXPONENTIAL

    @property
    def epsilon(self) -> float:
        return _epsilon(self.level, self.size, self.distance, self.scale)

    def rank_radius(self, alpha: float) -> float:
        """How far, in ranks, the released candidate may be from a true quantile.

        A candidate's score is ``den`` times its distance in ranks from being a
        true ``q``-quantile of its group (``dp.quantiles``); the best's is 0. The
        released index beats every other by noise of scale ``scale`` added to the
        scores (Gumbel or exponential noise, i.e. the exponential mechanism or
        permute-and-flip): a candidate scoring ``t`` worse than the best wins only
        if its noise beats the best's by ``t``, which has probability at most
        ``exp(-t/scale)``. Over the other ``size - 1`` candidates, the released
        score exceeds the best by more than ``scale·ln(size/alpha)`` with
        probability below ``alpha``. Public: it depends on the plan only.
        """
        if self.size == 1 or self.scale == 0:
            return 0.0
        _, den, _ = alpha_fraction(self.level)
        return self.scale * math.log(self.size / alpha) / den

    def select(self, histogram: Mapping[int, int]) -> int:
        """The index of the candidate released for one partition."""
        if self.size == 1:
            return 0
        return int(_noisy_min(self.scale)(scores(histogram, self.size, self.level)))


def calibrate_quantile(level: float, size: int, distance: int, epsilon: float) -> QuantileNoise:
    """The smallest scale whose OpenDP privacy map stays within ``epsilon``."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    if size == 1 or distance == 0:
        return QuantileNoise(level, size, distance, 0.0)
    num, den, _ = alpha_fraction(level)
    scale = 2.0 * score_sensitivity(num, den) * distance / epsilon
    while _epsilon(level, size, distance, scale) > epsilon:
        scale = math.nextafter(scale, math.inf)
    return QuantileNoise(level, size, distance, scale)


def alpha_fraction(level: float) -> tuple[int, int, int]:
    """``(numerator, denominator, size_limit)`` as OpenDP derives them for ``level``
    when the data size is unknown: the exact fraction if its denominator is
    below 10,000, else the multiple of 1/10,000 just below."""
    exact = Fraction(level)
    if exact.denominator < _ALPHA_DEN:
        num, den = exact.numerator, exact.denominator
    else:
        num, den = math.floor(level * _ALPHA_DEN), _ALPHA_DEN  # OpenDP truncates
    return num, den, _U64_MAX // den


def scores(histogram: Mapping[int, int], size: int, level: float) -> list[int]:
    """The candidates' scores at ``level`` (lower is better; ``dp.quantiles``), at
    OpenDP's fraction for the level."""
    num, den, _ = alpha_fraction(level)
    return quantile_scores(histogram, size, num, den)


def _epsilon(level: float, size: int, distance: int, scale: float) -> float:
    if distance == 0 or size == 1:
        return 0.0
    num, den, _ = alpha_fraction(level)
    per_unit = _noisy_min(scale).map(score_sensitivity(num, den))
    return math.nextafter(distance * per_unit, math.inf)


@lru_cache(maxsize=256)
def _noisy_min(scale: float) -> Measurement:
    return measurements.make_noisy_max(
        vector_domain(atom_domain(T="u64")),
        linf_distance(T="u64"),
        max_divergence(),
        scale=scale,
        negate=True,
    )
