"""L2 sensitivities of grouped aggregates, for Gaussian noise.

The same contribution bounds as the L1 sensitivities of ``sensitivity``:
one privacy unit adds at most ``rows`` rows to each of at most ``groups``
of ``partitions`` released partitions. Gaussian noise is calibrated to the
L2 norm of the change, which spreads a unit's influence over its groups:
√groups times one cell's change instead of groups times it.

Under ``add_remove`` each of at most ``groups`` cells moves by at most
``reach``. Under ``substitute`` a cell both units touch moves by at most
``width`` and one only one of them touches by at most ``reach``; with ``s``
shared cells the squared norm is ``s·width² + 2(groups − s)·reach²``. It is
linear in ``s``, so the worst case is at an end of the feasible range
``[max(0, 2·groups − partitions), groups]`` — unlike L1, sharing may be the
worse end, since ``width`` can reach ``2·reach``.
"""

from __future__ import annotations

from dpmagic.gate.mechanisms import sqrt_up
from dpmagic.gate.policy import NEIGHBOURING, Neighbouring
from dpmagic.gate.sensitivity import Contribution


def sum_l2_sensitivity(
    lower: int, upper: int, c: Contribution, neighbouring: Neighbouring
) -> float:
    """An upper bound (rounded up) on the L2 change of per-partition sums of values
    in ``[lower, upper]`` between neighbours."""
    return sqrt_up(sum_l2_squared(lower, upper, c, neighbouring))


def sum_l2_squared(lower: int, upper: int, c: Contribution, neighbouring: Neighbouring) -> int:
    """The exact worst-case squared L2 change, an integer in grid units."""
    if lower > upper:
        raise ValueError("lower bound above upper bound")
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
    reach = c.rows * max(abs(lower), abs(upper))
    if neighbouring == Neighbouring.ADD_REMOVE:
        return c.groups * reach * reach
    width = c.rows * (max(upper, 0) - min(lower, 0))
    fewest = max(0, 2 * c.groups - c.partitions)
    return max(s * width * width + 2 * (c.groups - s) * reach * reach for s in (fewest, c.groups))
