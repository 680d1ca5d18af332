"""Rule: a sum noised around a centre, as an AVG's and a variance's sums are.

The SQL returns the exact sum ``S`` of a unit's clamped values on the grid and the
exact count ``N`` of the rows it adds up (the non-NULL values of the same
argument). The noise is added to ``per_grid·S − units·N``, the sum of
``per_grid·v − units`` over those rows: the values moved by the centre
``units/per_grid`` grid units. Both exact numbers stay in the gate; only the
centred sum, plus noise, is released.

**Its bounds** (``centred_bounds``): a row the count counts adds to ``S`` either
its clamped value ``v`` in ``[L, H]`` or 0 (a value the sum's cast reads as
NULL), so its term ``per_grid·v − units`` lies in ``[per_grid·min(L, 0) − units,
per_grid·max(H, 0) − units]``; a row the count does not count has a NULL
argument, which the sum reads as NULL too, and adds nothing to either. The
centred sum is thus a per-partition sum of values within those bounds over the
same bounded rows, and ``sums.sum_sensitivity`` of those bounds bounds it (its
proof holds for any bounds).

**The centre** (``centre``): ``units`` the middle of ``[min(L, 0), max(H, 0)]``
(``per_grid = 2`` when that middle falls between two integers of an integer sum,
so the centre is a whole number of half units; a float sum's grid is fine enough
that half a unit off the middle costs nothing, so its centre stays whole). The
bounds are then ``[−R, R]`` (or within one half unit of it), ``R`` half the
width: under ``add_remove`` half the raw sum's sensitivity ``rows·max(|L|, |H|)``
per group, in released units, when the bounds do not straddle 0 (``L ≥ 0`` or
``H ≤ 0``), and never more than it otherwise. The noise is released in units of
``2**grid_exp / per_grid``.
"""

from __future__ import annotations


def centre(lo: int, hi: int, integral: bool) -> tuple[int, int] | None:
    """``(units, per_grid)``: the middle of ``[min(lo, 0), max(hi, 0)]`` in grid units
    (``lo``, ``hi`` the grid's bounds), or None when it is 0 already."""
    low, high = min(lo, 0), max(hi, 0)
    if (low + high) % 2 == 0 or not integral:
        units, per_grid = (low + high) // 2, 1
    else:
        units, per_grid = low + high, 2
    return None if units == 0 else (units, per_grid)


def centred_bounds(lo: int, hi: int, units: int, per_grid: int) -> tuple[int, int]:
    """The bounds of one row's term ``per_grid·v − units`` in the centred sum."""
    return per_grid * min(lo, 0) - units, per_grid * max(hi, 0) - units
