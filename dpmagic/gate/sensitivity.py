"""L1 sensitivities of grouped aggregates after contribution bounding.

After the rewrite bounds contributions, one privacy unit adds at most
``rows`` rows to each of at most ``groups`` partitions, out of ``partitions``
released partitions. Every released cell of one aggregate forms one vector;
its L1 sensitivity is what the noise scale is calibrated to, so parallel
composition over disjoint partitions falls out of the arithmetic rather than
being a separate rule.

Under ``add_remove`` a neighbour adds or removes one unit. Under
``substitute`` a neighbour replaces one unit's rows by any other rows that
satisfy the same bounds (possibly none), which covers both the bounded
(fixed-size) and the user-level replacement relations.

All quantities are exact integers in the aggregate's fixed-point units: the
rewrite turns every summed value into an integer on a grid before summing.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmagic.gate.policy import NEIGHBOURING, Neighbouring


@dataclass(frozen=True)
class Contribution:
    """How much one privacy unit can touch, as enforced by the rewrite."""

    groups: int  # partitions one unit may reach, already capped by the partition count
    rows: int  # rows one unit may add to one partition
    partitions: int  # partitions released

    @classmethod
    def bounded(cls, max_groups: int, max_rows: int, partitions: int) -> Contribution:
        if min(max_groups, max_rows, partitions) < 1:
            raise ValueError("contribution bounds and partition count must be positive")
        return cls(groups=min(max_groups, partitions), rows=max_rows, partitions=partitions)


def sum_sensitivity(lower: int, upper: int, c: Contribution, neighbouring: Neighbouring) -> int:
    """L1 sensitivity of per-partition sums of values in ``[lower, upper]``.

    A unit's total in one partition lies in ``[rows*min(lower,0), rows*max(upper,0)]``
    (absent rows and NULLs add 0). Removing it moves a cell by at most
    ``reach = rows*max(|lower|, |upper|)``. Replacing it moves a partition both
    units touch by at most ``width = rows*(max(upper,0) - min(lower,0))`` and a
    partition only one of them touches by at most ``reach``. With ``g`` groups
    each, the replacement touches at most ``2g`` partitions but only
    ``partitions`` exist, so at least ``2g - partitions`` are shared; since
    ``width <= 2*reach`` the worst case shares as few as possible.
    """
    if lower > upper:
        raise ValueError("lower bound above upper bound")
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
    reach = c.rows * max(abs(lower), abs(upper))
    if neighbouring == Neighbouring.ADD_REMOVE:
        return c.groups * reach
    width = c.rows * (max(upper, 0) - min(lower, 0))
    shared = max(0, 2 * c.groups - c.partitions)
    return shared * width + 2 * (c.groups - shared) * reach


def count_sensitivity(c: Contribution, neighbouring: Neighbouring) -> int:
    """L1 sensitivity of per-partition counts: a sum of ones. It also bounds a count
    of distinct values, since a unit's ``rows`` rows bring at most that many values
    to a partition; ``COUNT(DISTINCT unit)`` is the case ``rows = 1``."""
    return sum_sensitivity(1, 1, c, neighbouring)


def selection_distance(c: Contribution, neighbouring: Neighbouring) -> int:
    """How many values one unit can add or remove, over all partitions, in the
    multisets a quantile is chosen from. Unlike a sum, a replacement cannot cancel:
    the old unit's values leave and the new one's arrive."""
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
    reach = c.groups * c.rows
    return reach if neighbouring == Neighbouring.ADD_REMOVE else 2 * reach
