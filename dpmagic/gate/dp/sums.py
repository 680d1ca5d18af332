"""Rule: the L1 and L2 sensitivity of per-partition sums of values in ``[lo, hi]``.

All quantities are exact integers in the aggregate's fixed-point units: the rewrite
turns every summed value into an integer on a grid before summing.

Proof. A unit's total in one partition lies in ``[rows·min(lo, 0), rows·max(hi, 0)]``
(absent rows and NULLs add 0). Removing or adding it moves a cell by at most
``reach = rows·max(|lo|, |hi|)``, in at most ``groups`` cells: L1 ``groups·reach``,
squared L2 ``groups·reach²``. Replacing it moves a cell both units touch by at most
``width = rows·(max(hi, 0) − min(lo, 0))`` and a cell only one touches by at most
``reach``. Each unit touches at most ``groups`` cells of ``partitions``, so with
``s`` cells shared (``max(0, 2·groups − partitions) ≤ s ≤ groups``) the change is
at most ``s·width + 2(groups − s)·reach`` in L1, largest at the smallest ``s``
since ``width ≤ 2·reach``, and ``s·width² + 2(groups − s)·reach²`` in squared L2,
linear in ``s`` and so largest at an end of its range (here sharing may be the
worse end, since ``width²`` can reach ``4·reach²``). Every bound is attained: a
unit at the bounds in as many cells as it may reach.
"""

from __future__ import annotations

from dpmagic.gate.dp.contribution import Contribution, checked_relation
from dpmagic.gate.dp.mechanisms import sqrt_up
from dpmagic.gate.policy import Neighbouring


def sum_sensitivity(lower: int, upper: int, c: Contribution, neighbouring: Neighbouring) -> int:
    """L1 sensitivity of per-partition sums of values in ``[lower, upper]``."""
    reach, width, fewest = _cells(lower, upper, c)
    if checked_relation(neighbouring) == Neighbouring.ADD_REMOVE:
        return c.groups * reach
    return fewest * width + 2 * (c.groups - fewest) * reach


def sum_l2_squared(lower: int, upper: int, c: Contribution, neighbouring: Neighbouring) -> int:
    """The exact worst-case squared L2 change, an integer in grid units."""
    reach, width, fewest = _cells(lower, upper, c)
    if checked_relation(neighbouring) == Neighbouring.ADD_REMOVE:
        return c.groups * reach * reach
    return max(s * width * width + 2 * (c.groups - s) * reach * reach for s in (fewest, c.groups))


def sum_l2_sensitivity(
    lower: int, upper: int, c: Contribution, neighbouring: Neighbouring
) -> float:
    """An upper bound (rounded up) on the L2 change, for Gaussian noise."""
    return sqrt_up(sum_l2_squared(lower, upper, c, neighbouring))


def _cells(lower: int, upper: int, c: Contribution) -> tuple[int, int, int]:
    """``reach``, ``width`` and the fewest cells a replacement must share (above)."""
    if lower > upper:
        raise ValueError("lower bound above upper bound")
    reach = c.rows * max(abs(lower), abs(upper))
    width = c.rows * (max(upper, 0) - min(lower, 0))
    return reach, width, max(0, 2 * c.groups - c.partitions)
