"""Whether noise dominates a released cell: one rule, decided in the release pass.

A reader must not take noise for a finding, so every noisy cell of a reply
carries a verdict, computed here from the plan and the noisy values only
(post-processing: it costs no privacy), and the notebook shows it as it is;
the rule is stated once, in docs/accuracy.md ("When noise dominates"):

- a value with a declared range (an average, a variance, a standard
  deviation, or one of them rounded or scaled by a constant): noise dominates
  when its interval covers at least half of that range (``range_rule``). The
  interval's width goes as one over the group's size, which the gate knows
  only from a noisy count: so the width is judged at the smallest size the
  count's interval allows (``stretch``), and a group that may be empty is
  dominated. A bare average or variance is judged by the larger of that and
  the width the plan's 95% error gives at that size at the least favourable
  values its bounds allow (``expected_width``): a draw whose interval came out
  narrow by luck is judged by what its noise can do;
- counts, sums and anything else computed from noisy values: noise dominates
  a true value ``t`` when the noise's 95% half-width ``h`` is at least
  ``|t|``; the gate sees ``t`` only through its interval, so it flags a cell
  whose interval holds a value the noise would dominate, i.e. whose distance
  from 0 is at most its half-width (``zero_rule``: ``|v| ≤ 2h`` for a
  symmetric interval). Whenever the interval holds the truth, a truth the
  noise dominates is then flagged. A count, or a sum of values that cannot be
  negative, below 0 is noise whatever its size (``signed_rule``);
- a quantile: from a noisy count of the values it was chosen from (the
  query's own ``COUNT`` of the same argument, in the same group), the band of
  the group's percentiles its rank radius allows (``percentile_band``);
  noise dominates when the band covers at least half of the group, or the
  count's interval reaches below one value. Without such a count the gate
  cannot tell: the verdict is ``None``, shown as "noise may dominate".

A cell with no interval (an expression whose interval is unknown, such as a
ratio whose denominator's interval reaches 0) gets ``None`` too.
"""

from __future__ import annotations

import numpy as np

DOMINANT_SHARE = 0.5
"""Noise dominates a value whose interval covers at least this share of its range."""


def zero_rule(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per cell, whether ``[lo, hi]`` holds a value whose magnitude is at most the
    interval's half-width: its distance from 0 is at most that half-width. A
    point interval (no noise) is never dominated."""
    half = (hi - lo) / 2
    distance = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
    return (hi > lo) & (distance <= half)


def signed_rule(value: np.ndarray, half: float, sign: int) -> np.ndarray:
    """``zero_rule`` for ``value ± half`` of a quantity whose sign is known (``sign``
    +1: never negative, −1: never positive, 0: either): a value on the wrong side of
    0 is noise, however far."""
    if not half > 0:
        return np.zeros(len(value), dtype=bool)
    if sign > 0:
        return value <= 2 * half
    if sign < 0:
        return value >= -2 * half
    return np.abs(value) <= 2 * half


def range_rule(
    lo: np.ndarray,
    hi: np.ndarray,
    low: float,
    high: float,
    stretch: np.ndarray | None = None,
    floor: np.ndarray | None = None,
) -> np.ndarray:
    """Per cell, whether ``[lo, hi]``, its width times ``stretch`` (the group's noisy
    size over the least its count's interval allows; ``inf`` where that is below one
    row), or ``floor`` where larger (``expected_width``), covers at least
    ``DOMINANT_SHARE`` of ``[low, high]``."""
    if not high > low:
        return np.zeros(len(lo), dtype=bool)
    width = hi - lo
    if stretch is not None:
        with np.errstate(invalid="ignore"):
            width = np.where(np.isinf(stretch), np.inf, width * stretch)
    if floor is not None:
        width = np.fmax(width, floor)
    return width >= DOMINANT_SHARE * (high - low)


def expected_width(
    error: float, least: np.ndarray, lo: np.ndarray, hi: np.ndarray, root: bool
) -> np.ndarray:
    """The width of a 95% interval the plan's error allows in a group of ``least`` rows
    (``error/least`` each side; ``inf`` below one row), at the least favourable values
    the bounds allow (``expected``): a cell whose own interval came out narrower, by a
    lucky draw, is judged by this. A standard deviation's (``root``) is the square
    root's of its variance's interval around the cell's middle squared."""
    with np.errstate(divide="ignore", invalid="ignore"):
        half = np.where(least >= 1, error / np.maximum(least, 1.0), np.inf)
        if not root:
            return 2 * half
        v = ((lo + hi) / 2) ** 2
        return np.sqrt(v + half) - np.sqrt(np.maximum(v - half, 0.0))


def count_stretch(counts: np.ndarray, half: float) -> np.ndarray:
    """``n / (n − half)`` per noisy count ``n`` whose interval reaches down to ``n − half``;
    ``inf`` where that is below one row (the group may be empty)."""
    least = counts - half
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(least >= 1, np.maximum(counts, 1.0) / np.maximum(least, 1.0), np.inf)


def percentile_band(
    level: float, radius: float, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The band of percentiles ``[a, b]`` a quantile's rank radius allows in groups of
    at least ``counts`` values (a count's lower end), and whether noise dominates:
    the band covers at least ``DOMINANT_SHARE`` of the group, or the group may hold
    fewer than one value (then the band is all of it, ``[0, 1]``)."""
    known = counts >= 1
    n = np.where(known, counts, 1.0)
    a = np.where(known, np.maximum(0.0, level - radius / n), 0.0)
    b = np.where(known, np.minimum(1.0, level + radius / n), 1.0)
    return a, b, (~known) | (b - a >= DOMINANT_SHARE)


def verdicts(flags: np.ndarray, unknown: np.ndarray | None = None) -> list[bool | None]:
    """The JSON list: ``True``/``False`` per cell, ``None`` where ``unknown``."""
    out: list[bool | None] = flags.astype(bool).tolist()
    if unknown is not None:
        for i in np.flatnonzero(unknown).tolist():
            out[i] = None
    return out
