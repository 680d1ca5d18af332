"""A quantile's interval in the column's units: two more selections per group.

The exponential mechanism's guarantee is in ranks (``dp.quantiles``,
``QuantileNoise.rank_radius``): with probability at least ``1 − a``, a candidate
``c`` released at level ``p`` from a group of ``n`` values scores at most
``den·r`` for its radius ``r = r_p(a)``, so at most ``p·n + r`` values lie
strictly below it and at least ``p·n − r`` at or below it. Turning that into
values needs the data's distribution, which only more budget can tell; this
pass spends it.

Per group, from the noisy count ``N`` of the values the quantile is chosen from
(its ``COUNT`` of the same argument, which the plan adds when the query has
none) and its interval's lower end ``n₋ = N − h`` (at ``alpha/3``), two more
candidates are chosen from the same histogram, each with its own ε
(``plan.Edges``). Let ``Q`` be the group's true ``q``-quantile: the least
candidate with at least ``q·n`` values at or below it.

- ``L`` at the largest level ``p`` on a grid of 1/1000 with
  ``p + r_p/n₋ < q`` (``r_p`` its radius at ``alpha/3``). If ``L > Q``, every
  value at or below ``Q`` is strictly below ``L``: at least ``q·n`` are. But at
  most ``p·n + r_p < q·n`` are when ``n ≥ n₋``. So ``L ≤ Q``. Where no level
  above 0 will do, ``L`` is the grid's first candidate, which every (clamped)
  value is at or above.
- ``U`` at the smallest ``p`` with ``p − r_p/n₋ ≥ q``. If ``U < Q``, the values
  at or below ``U`` are fewer than ``q·n`` (``Q`` is the least candidate with
  that many); but at least ``p·n − r_p ≥ q·n`` are. So ``U ≥ Q``; else the
  grid's last candidate.

The three events (the count's interval, each edge's radius) fail with
probability at most ``alpha/3`` each (``dp.levels.EDGE_PART_ALPHA``, at
``alpha = EDGES_ALPHA``), so ``[L, U]`` holds ``Q`` with probability
at least ``1 − alpha``, whatever the data, ties included. A group whose count's
interval reaches below one value has the whole grid as its interval.

Privacy: each edge is the quantile's own mechanism (OpenDP's noisy max over the
``dp.quantiles`` scores) at its level, calibrated to the plan's ε for the edge
(``calibrate_quantile``), over the same histograms; its level is a function of
released noisy values only, so choosing it is post-processing, and the plan
charges the edges' ε (``dp.shares.EDGE_WEIGHT``) whatever the levels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from dpmagic.gate.dp.levels import EDGE_PART_ALPHA
from dpmagic.gate.dp.quantile_selection import QuantileNoise, calibrate_quantile

LEVEL_STEPS = 1000
"""Edge levels lie on a grid of 1/1000: few distinct levels, each calibrated once."""

_MAX_ROUNDS = 64


def lower_level(level: float, least: float, radius: Callable[[float], float]) -> float | None:
    """The largest level ``p`` on the 1/``LEVEL_STEPS`` grid, above 0, with
    ``p + radius(p)/least < level``; None when there is none. A fixed point from
    ``level`` down, then a bisection back toward it (the nearest where the
    condition is monotone, as it is for a radius growing slower than ``least``)."""

    def fits(p: float) -> bool:
        return p + radius(p) / least < level

    return _nearest(level, -1, fits, lambda p: level - radius(p) / least)


def upper_level(level: float, least: float, radius: Callable[[float], float]) -> float | None:
    """The smallest level ``p`` on the grid, below 1, with ``p − radius(p)/least ≥ level``;
    None when there is none."""

    def fits(p: float) -> bool:
        return p - radius(p) / least >= level

    return _nearest(level, 1, fits, lambda p: level + radius(p) / least)


def _nearest(
    level: float, side: int, fits: Callable[[float], bool], guess: Callable[[float], float]
) -> float | None:
    """The grid level nearest ``level`` on ``side`` (−1 below, +1 above) that ``fits``,
    strictly inside (0, 1); ``guess(p)`` the bound the radius at ``p`` sets."""

    def on_grid(x: float) -> int:
        return math.floor(x * LEVEL_STEPS) if side < 0 else math.ceil(x * LEVEL_STEPS)

    k = on_grid(level)
    for _ in range(_MAX_ROUNDS):
        k = (
            min(k, on_grid(guess(k / LEVEL_STEPS)))
            if side < 0
            else max(k, on_grid(guess(k / LEVEL_STEPS)))
        )
        if not 0 < k < LEVEL_STEPS:
            return None
        if fits(k / LEVEL_STEPS):
            break
        k += side
    else:
        return None
    # The fixed point may overshoot where the radius shrinks toward the middle:
    # bisect between ``level`` and ``k`` (``k`` always fits).
    near = on_grid(level) - side  # a level past ``level``'s own side never fits
    while abs(k - near) > 1:
        mid = (k + near) // 2
        if fits(mid / LEVEL_STEPS):
            k = mid
        else:
            near = mid
    return k / LEVEL_STEPS


@lru_cache(maxsize=4096)
def _calibrated(level: float, size: int, distance: int, epsilon: float) -> QuantileNoise:
    return calibrate_quantile(level, size, distance, epsilon)


def edge_values(
    level: float,
    size: int,
    distance: int,
    epsilon: float,
    histograms: list[dict],
    counts: list[float],
    count_half: float,
    value: Callable[[int], int | float],
) -> tuple[list[int | float], list[int | float]]:
    """Per group, ``L`` and ``U`` (see the module's docstring): ``histograms`` the
    groups' candidate-index histograms, ``counts`` their noisy counts, ``count_half``
    the count's half-width at ``EDGE_PART_ALPHA``, ``value`` a candidate index's value."""

    def noise_at(p: float) -> QuantileNoise:
        return _calibrated(p, size, distance, epsilon)

    def radius(p: float) -> float:
        return noise_at(p).rank_radius(EDGE_PART_ALPHA)

    lows: list[int | float] = []
    highs: list[int | float] = []
    first, last = value(0), value(size - 1)
    for histogram, count in zip(histograms, counts, strict=True):
        least = float(count) - count_half
        if not least >= 1:
            lows.append(first)
            highs.append(last)
            continue
        p = lower_level(level, least, radius)
        lows.append(first if p is None else value(noise_at(p).select(histogram)))
        p = upper_level(level, least, radius)
        highs.append(last if p is None else value(noise_at(p).select(histogram)))
    return lows, highs


def edge_names(selection: str) -> tuple[str, str]:
    """The noisy vectors of a selection's interval ends."""
    return f"{selection}_lo", f"{selection}_hi"
