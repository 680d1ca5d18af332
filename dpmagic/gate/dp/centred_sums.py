"""Rule: a sum noised around a centre, as an AVG's and a variance's sums are.

The SQL returns the exact sum ``S`` of a unit's clamped values on the grid and the
exact count ``N`` of the rows it adds up (the non-NULL values of the same
argument). The noise is added to ``per_grid·S − units·N``, the sum of
``per_grid·v − units`` over those rows: the values moved by the centre
``units/per_grid`` grid units. Both exact numbers stay in the gate; only the
centred sum, plus noise, is released.

**Its bounds** (``centred_bounds``): a row the count counts adds to ``S`` its
clamped value ``v`` in ``[L, H]``, or, where the sum's reading of the argument can
be NULL while the argument is not (a value its cast cannot read; ``exact`` False),
0. So its term ``per_grid·v − units`` lies in ``[per_grid·L − units, per_grid·H −
units]`` when ``exact``, and in ``[per_grid·min(L, 0) − units, per_grid·max(H, 0) −
units]`` otherwise; a row the count does not count has a NULL argument, which the
sum reads as NULL too, and adds nothing to either. The centred sum is thus a
per-partition sum of values within those bounds over the same bounded rows, and
``sums.sum_sensitivity`` of those bounds bounds it (its proof holds for any
bounds). The plan decides ``exact`` once (``kinds.Summand``): it holds for a bare
declared number column of the sum's type, which the load stored of its type, so
that the sum reads NULL exactly where the count does not count.

**The centre** (``centre``): ``units`` the middle of that range of one term's value,
``[L, H]`` or ``[min(L, 0), max(H, 0)]`` (``per_grid = 2`` when that middle falls
between two integers of an integer sum, so the centre is a whole number of half
units; a float sum's grid is fine enough that half a unit off the middle costs
nothing, so its centre stays whole). The bounds are then ``[−R, R]`` (or within one
half unit of it), ``R`` half the range's width. Under ``add_remove`` that is, in
released units, ``rows·(H − L)/2`` per group when ``exact`` (a column declared
2019–2024 is noised for half of 5 a row, where its raw sum would be for 2024), and
otherwise half the raw sum's sensitivity ``rows·max(|L|, |H|)`` when the bounds do
not straddle 0 (``L ≥ 0`` or ``H ≤ 0``), never more than it. The noise is released
in units of ``2**grid_exp / per_grid``.
"""

from __future__ import annotations


def term_range(lo: int, hi: int, exact: bool) -> tuple[int, int]:
    """The range of one counted row's value in the sum, in grid units: ``[lo, hi]``
    when the sum reads NULL exactly where the count does not count (``exact``), else
    with 0 added (a row whose value the sum could not read)."""
    return (lo, hi) if exact else (min(lo, 0), max(hi, 0))


def centre(lo: int, hi: int, integral: bool, exact: bool) -> tuple[int, int] | None:
    """``(units, per_grid)``: the middle of ``term_range`` in grid units (``lo``,
    ``hi`` the grid's bounds), or None when it is 0 already."""
    low, high = term_range(lo, hi, exact)
    if (low + high) % 2 == 0 or not integral:
        units, per_grid = (low + high) // 2, 1
    else:
        units, per_grid = low + high, 2
    return None if units == 0 else (units, per_grid)


def centred_bounds(lo: int, hi: int, units: int, per_grid: int, exact: bool) -> tuple[int, int]:
    """The bounds of one row's term ``per_grid·v − units`` in the centred sum."""
    low, high = term_range(lo, hi, exact)
    return per_grid * low - units, per_grid * high - units
