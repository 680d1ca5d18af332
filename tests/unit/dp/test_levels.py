"""``dp/levels``: the parts of each interval, at the levels the split gives them, hold
together at least ``1 − α`` of the time; and every split adds back up to at most ``α``.

The statistical test draws each part's OpenDP-calibrated noise ``DRAWS`` times (a
count's or a sum's discrete Laplace or Gaussian noise, a quantile's exponential
mechanism on the least favourable histogram for its rank radius) and counts the
draws where some part's interval misses. When the rule is right a draw misses with
probability ``p ≤ α``, so the count exceeds ``_limit(α)``, the ``1 − FALSE_ALARM``
quantile of Binomial(``DRAWS``, ``α``), with probability below ``FALSE_ALARM`` =
10⁻⁶ per check: below 10⁻⁴ for the whole file. At ``α`` = 5% the limit is 1,150
misses in 20,000 (5.75%); a split at ``α/2`` for a variance's three parts misses
about 7.1% of the time, no split at all for two parts about 9.9%, and a quantile's
interval whose three events are each at ``α`` about 9%: all are caught (the
``caught`` tests).

The enumeration allows the float rounding of ``α/k`` (one part in 10¹² of ``α``,
``ROUNDING``): ``0.007/3`` times 3 is one unit in the last place above ``0.007``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
from scipy.stats import binom

from dpmagic.gate.dp.levels import (
    EDGE_PART_ALPHA,
    EDGE_PARTS,
    EDGES_ALPHA,
    REPORT_ALPHA,
    VARIANCE_PARTS,
    average_box_level,
    band_level,
    edges_hold,
    expression_level,
    joint_level,
    split,
    variance_box_level,
)
from dpmagic.gate.dp.mechanisms import Noise, calibrate, calibrate_gaussian
from dpmagic.gate.dp.quantile_selection import alpha_fraction, calibrate_quantile, scores

DRAWS = 20_000
FALSE_ALARM = 1e-6
ROUNDING = 1 + 1e-12

# Noise as the plan calibrates it, at scales where the integer grid is fine beside it.
COUNT = calibrate(1, 0.01)  # discrete Laplace, scale 100
TOTAL = calibrate(3, 0.05)  # discrete Laplace, scale 60
SQUARES = calibrate(9, 0.1)  # discrete Laplace, scale 90
GAUSS = calibrate_gaussian(1.0, 0.0005)  # discrete Gaussian, σ ≈ 31.6
GAUSS_TOTAL = calibrate_gaussian(3.0, 0.002)
QUANTILE_LEVEL, CANDIDATES = 0.5, 20
QUANTILE = calibrate_quantile(QUANTILE_LEVEL, CANDIDATES, 1, 0.5)

Part = Callable[[float], np.ndarray]
"""One part of an interval: given its level, per draw whether its event held."""


def noise_part(noise: Noise) -> Part:
    """A count's or a sum's interval ``value ± half_width(level)`` holds the truth."""

    def held(level: float) -> np.ndarray:
        return np.abs(noise.sample_array(DRAWS) * noise.granularity) <= noise.half_width(level)

    return held


def rank_part(level: float) -> np.ndarray:
    """A quantile's released candidate scores at most ``den·rank_radius(level)``, on a
    histogram that puts every other candidate just past that bound: every value at
    the first candidate, so all the others score the same, the least score above it."""
    _, den, _ = alpha_fraction(QUANTILE_LEVEL)
    bound = den * QUANTILE.rank_radius(level)
    histogram = _worst_histogram(bound)
    score = scores(histogram, CANDIDATES, QUANTILE_LEVEL)
    return np.array([score[QUANTILE.select(histogram)] <= bound for _ in range(DRAWS)])


@cache
def _worst_histogram(bound: float) -> dict[int, int]:
    n = max(1, math.floor(bound))
    while scores({0: n}, CANDIDATES, QUANTILE_LEVEL)[1] <= bound:
        n += 1
    return {0: n}


@cache
def _limit(alpha: float) -> int:
    """The most misses in ``DRAWS`` draws a rule whose draws miss with probability at
    most ``alpha`` exceeds with probability below ``FALSE_ALARM``."""
    return int(binom.isf(FALSE_ALARM, DRAWS, alpha))


def misses(parts: list[Part], level: float, alpha: float) -> int:
    """Draws in which some part, at ``level``, missed; asserted within ``_limit(alpha)``."""
    held = np.logical_and.reduce([part(level) for part in parts])
    missed = int(DRAWS - held.sum())
    limit = _limit(alpha)
    assert missed <= limit, f"{missed} of {DRAWS} draws missed, above {limit} at α = {alpha}"
    return missed


# Each split the gate uses: its level as a function of α, and the parts it covers.
SPLITS: dict[str, tuple[Callable[[float], float], list[Part]]] = {
    "expression of 2 (Laplace)": (lambda a: expression_level(a, 2), [noise_part(COUNT)] * 2),
    "expression of 4 (mixed)": (
        lambda a: expression_level(a, 4),
        [noise_part(COUNT), noise_part(TOTAL), noise_part(GAUSS), noise_part(GAUSS_TOTAL)],
    ),
    "variance box (Laplace)": (
        variance_box_level,
        [noise_part(COUNT), noise_part(TOTAL), noise_part(SQUARES)],
    ),
    "variance box (Gaussian)": (
        variance_box_level,
        [noise_part(GAUSS), noise_part(GAUSS_TOTAL), noise_part(GAUSS)],
    ),
    "average box (Laplace)": (average_box_level, [noise_part(TOTAL), noise_part(COUNT)]),
    "average box (Gaussian)": (average_box_level, [noise_part(GAUSS_TOTAL), noise_part(GAUSS)]),
    "quantile band": (band_level, [noise_part(COUNT), rank_part]),
}


@pytest.mark.search
@pytest.mark.parametrize("alpha", [REPORT_ALPHA, 0.2])
@pytest.mark.parametrize("kind", list(SPLITS))
def test_the_parts_of_each_split_hold_together(kind, alpha):
    level, parts = SPLITS[kind]
    misses(parts, level(alpha), alpha)


@pytest.mark.search
def test_a_quantiles_interval_ends_and_count_hold_together():
    """The three events ``sql/edges`` rests on, each at ``EDGE_PART_ALPHA``."""
    misses([noise_part(COUNT), rank_part, rank_part], EDGE_PART_ALPHA, EDGES_ALPHA)


@pytest.mark.search
@pytest.mark.parametrize(
    ("parts", "broken"),
    [
        ([noise_part(COUNT), noise_part(TOTAL), noise_part(SQUARES)], lambda a: split(a, 2)),
        ([noise_part(COUNT), noise_part(TOTAL)], lambda a: a),
        ([noise_part(COUNT), rank_part, rank_part], lambda a: a),
    ],
    ids=["three parts at α/2", "two parts unsplit", "quantile edges unsplit"],
)
def test_a_split_too_coarse_for_its_parts_is_caught(parts, broken):
    with pytest.raises(AssertionError):
        misses(parts, broken(REPORT_ALPHA), REPORT_ALPHA)


ALPHAS = [1e-9, 1e-6, 0.001, 0.003, 0.007, 0.01, 0.05, 0.1, 1 / 3, 0.5, 0.9]


def _adds_up(alpha: float, levels: list[float]) -> bool:
    return math.fsum(levels) <= alpha * ROUNDING


@pytest.mark.parametrize("alpha", ALPHAS)
def test_every_split_adds_back_up_to_at_most_alpha(alpha):
    for k in range(1, 65):
        assert _adds_up(alpha, [split(alpha, k)] * k)
        assert _adds_up(alpha, [expression_level(alpha, k)] * k)
    assert _adds_up(alpha, [variance_box_level(alpha)] * VARIANCE_PARTS)
    assert _adds_up(alpha, [average_box_level(alpha)] * 2)
    assert _adds_up(alpha, [band_level(alpha)] * 2)
    assert _adds_up(alpha, [joint_level(alpha)])
    # A quantile's interval stands for a (1 − alpha) one only where its own level fits.
    assert edges_hold(alpha) == _adds_up(alpha, [EDGE_PART_ALPHA] * EDGE_PARTS)


def test_a_split_that_does_not_add_up_is_caught():
    assert not _adds_up(REPORT_ALPHA, [split(REPORT_ALPHA, 2)] * VARIANCE_PARTS)
    assert not _adds_up(REPORT_ALPHA, [REPORT_ALPHA] * 2)
