"""The exponential mechanism behind MIN, MAX, MEDIAN and percentiles.

Scores are zero exactly at the true quantiles, with the sensitivity OpenDP gives
its own score, the noise is OpenDP's noisy max, released values stay within the declared
bounds and concentrate near the true quantile, and an empirical privacy test
that passes the calibrated mechanism catches one with a quarter of the noise.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import opendp.prelude as dp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import beta

from dpmagic.gate.dp.quantile_selection import (
    QuantileNoise,
    alpha_fraction,
    calibrate_quantile,
    grid,
    scores,
)
from dpmagic.gate.dp.quantiles import score_sensitivity

LEVELS = [0.0, 0.5, 1.0, 0.9, 0.25, 0.123, 0.99995, 0.00005, 1 / 3]


@settings(max_examples=200, deadline=None)
@given(
    level=st.one_of(st.sampled_from(LEVELS), st.floats(0, 1)),
    size=st.integers(1, 12),
    data=st.data(),
)
def test_a_score_is_zero_exactly_at_the_true_quantiles(level, size, data):
    """A candidate scores 0 when at most ``q·n`` values lie strictly below it and at
    least ``q·n`` at or below it (at OpenDP's fraction for ``q``); else ``den`` times
    its distance in ranks from that."""
    values = data.draw(st.lists(st.integers(0, size - 1), max_size=40))
    num, den, _ = alpha_fraction(level)
    got = scores(Counter(values), size, level)
    for c in range(size):
        below = sum(v < c for v in values)
        upto = sum(v <= c for v in values)
        target = Fraction(num * len(values), den)
        assert Fraction(got[c], den) == max(0, below - target, target - upto)


@pytest.mark.parametrize("level", LEVELS)
def test_the_score_sensitivity_is_the_number_opendp_gives_its_own_score(level):
    num, den, _ = alpha_fraction(level)
    opendp_score = dp.t.make_quantile_score_candidates(
        dp.vector_domain(dp.atom_domain(T="i64")), dp.symmetric_distance(), [0, 1], level
    )
    assert score_sensitivity(num, den) == opendp_score.map(1)


def test_values_sharing_the_median_keep_it_the_best_candidate():
    """55 values at 0 and 45 spread above: the median is 0. OpenDP's own score
    (``|(den − num)·below − num·above|``, the values at a candidate left out) ranks
    every candidate from 1 to 45 above it; this one ranks 0 alone best."""
    histogram = {0: 55, **{i: 1 for i in range(1, 46)}}
    got = scores(histogram, 46, 0.5)
    assert got[0] == 0 and min(got[1:]) >= 2 * 5  # 5 ranks from the median, den = 2
    opendp = dp.t.make_quantile_score_candidates(
        dp.vector_domain(dp.atom_domain(T="i64")), dp.symmetric_distance(), list(range(46)), 0.5
    )([v for v, k in histogram.items() for _ in range(k)])
    assert opendp[0] > min(opendp)  # OpenDP's score prefers a candidate past the median


def test_alpha_fractions_follow_opendp():
    assert alpha_fraction(0.5)[:2] == (1, 2)
    assert alpha_fraction(0.9)[:2] == (9000, 10000)
    assert alpha_fraction(0.00007)[:2] == (0, 10000)  # truncated, as OpenDP does


@pytest.mark.parametrize(
    ("lo", "hi", "integral", "size", "last"),
    [(0, 100, True, 101, 100), (-3, 5, True, 9, 5), (0, 2500, True, 835, 2500),
     (0.0, 500000.0, False, 1001, 500000.0), (7, 7, True, 1, 7)],
)  # fmt: skip
def test_grids_cover_the_bounds_and_never_leave_them(lo, hi, integral, size, last):
    g = grid(lo, hi, integral)
    assert g.size == size
    assert g.value(0) == lo and g.value(g.size - 1) == last
    assert all(lo <= g.value(i) <= hi for i in range(g.size))


def test_calibration_meets_epsilon_by_opendps_map():
    for level in (0.5, 0.9, 0.0):
        for distance in (1, 4, 16):
            noise = calibrate_quantile(level, 101, distance, 0.7)
            assert noise.epsilon <= 0.7
            assert QuantileNoise(level, 101, distance, noise.scale * 0.99).epsilon > 0.7


def test_released_quantiles_concentrate_near_the_true_one():
    """1,000 values; ε = 1. The exponential mechanism's tail bound: a draw's score
    exceeds the best by more than scale·(ln K + t) with probability at most e^-t.
    With t = ln(3·10^8) the chance that any of 300 draws does is below 10^-6."""
    size = 101
    values = Counter((i * 37) % size for i in range(1000))  # spread over 0..100
    noise = calibrate_quantile(0.5, size, 1, 1.0)
    s = scores(values, size, 0.5)
    best = min(s)
    slack = noise.scale * (math.log(size) + math.log(3e8))
    draws = [noise.select(values) for _ in range(300)]
    assert all(0 <= d < size for d in draws)
    assert all(s[d] <= best + slack for d in draws)
    true_median = 50
    assert sum(abs(d - true_median) <= 3 for d in draws) >= 270  # most land very close


def _violation(noise: QuantileNoise, a: dict, b: dict, epsilon: float, n: int) -> bool:
    """Whether sampling shows P[out=c | a] > e^ε · P[out=c | b] for some c, with
    Clopper-Pearson bounds at 10^-4 each (so the calibrated mechanism is flagged
    with probability below 10^-3 over the 6 comparisons)."""
    ca = Counter(noise.select(a) for _ in range(n))
    cb = Counter(noise.select(b) for _ in range(n))
    for x, y in ((ca, cb), (cb, ca)):
        for c in range(noise.size):
            low = beta.ppf(1e-4, x[c], n - x[c] + 1) if x[c] else 0.0
            high = beta.ppf(1 - 1e-4, y[c] + 1, n - y[c]) if y[c] < n else 1.0
            if low > math.exp(epsilon) * high:
                return True
    return False


@pytest.mark.search
def test_empirical_privacy_passes_the_mechanism_and_catches_a_mis_scaled_one():
    # Neighbouring data (one value 0 added) over three candidates.
    a, b = {0: 3, 2: 2}, {0: 4, 2: 2}
    calibrated = calibrate_quantile(0.5, 3, 1, 1.0)
    assert not _violation(calibrated, a, b, 1.0, 8000)
    too_little_noise = QuantileNoise(0.5, 3, 1, calibrated.scale / 4)
    assert _violation(too_little_noise, a, b, 1.0, 8000)


# Coverage of the rank radius. The radius bounds, with probability 1 - ALPHA,
# how much the released candidate's rank imbalance exceeds the best one's.
# Data at the lowest candidate only make every other candidate equally bad,
# where the union bound behind the radius is nearly tight: with the bad
# candidates just beyond the radius, a miss has probability up to ALPHA; a
# radius half as wide leaves them inside the miss region at three quarters of
# the radius, where most runs miss.
ALPHA = 0.05
RUNS = 1500
# P(Binomial(RUNS, ALPHA) > MISSES) < 1e-3: a correct radius fails this test less
# often than once in a thousand runs of the suite.
MISSES = 106


def _imbalance_gap(histogram: dict[int, int], size: int, level: float, chosen: int) -> float:
    s = scores(histogram, size, level)
    _, den, _ = alpha_fraction(level)
    return (s[chosen] - min(s)) / den


def _misses(noise: QuantileNoise, histogram: dict[int, int], radius: float) -> int:
    gaps = [_imbalance_gap(histogram, noise.size, noise.level, i) for i in range(noise.size)]
    return sum(gaps[noise.select(histogram)] > radius for _ in range(RUNS))


def test_miss_threshold_has_the_stated_error_rate():
    from scipy.stats import binom

    assert binom.sf(MISSES, RUNS, ALPHA) < 1e-3


@pytest.mark.search
@pytest.mark.parametrize("level", [0.5, 0.9])
def test_rank_radius_covers_at_least_95_percent_where_the_bound_is_tight(level):
    noise = calibrate_quantile(level, 1001, 1, 1.0)
    radius = noise.rank_radius(ALPHA)
    num, den, _ = alpha_fraction(level)
    # Every candidate above the lowest has imbalance (1 - q)·n: put it just past the radius.
    n = math.floor(radius / (1 - num / den)) + 1
    assert _imbalance_gap({0: n}, 1001, level, 1) > radius
    assert _misses(noise, {0: n}, radius) <= MISSES


@pytest.mark.search
def test_a_radius_half_as_wide_is_caught():
    noise = calibrate_quantile(0.5, 1001, 1, 1.0)
    radius = noise.rank_radius(ALPHA)
    n = round(1.5 * radius)  # bad candidates at 3/4 of the radius
    assert radius / 2 < _imbalance_gap({0: n}, 1001, 0.5, 1) < radius
    assert _misses(noise, {0: n}, radius) == 0
    assert _misses(noise, {0: n}, radius / 2) > MISSES


def test_rank_radius_is_public_and_shrinks_with_epsilon():
    wide = calibrate_quantile(0.5, 1001, 1, 0.5).rank_radius(ALPHA)
    narrow = calibrate_quantile(0.5, 1001, 1, 2.0).rank_radius(ALPHA)
    assert narrow < wide
    assert calibrate_quantile(0.5, 1, 1, 1.0).rank_radius(ALPHA) == 0.0
