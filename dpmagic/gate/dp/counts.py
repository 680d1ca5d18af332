"""Rule: counts and distinct counts are sums of ones.

``COUNT(*)`` and ``COUNT(x)`` add 1 for each of a unit's counted rows: per-partition
sums of values in ``[1, 1]``, whose sensitivity ``sums`` gives. ``COUNT(DISTINCT
x)`` changes by at most the number of distinct values a unit brings to a
partition, which is at most its ``rows`` rows there: the same bound. ``COUNT(DISTINCT
unit)`` is the case ``rows = 1``: a unit is one value in each partition it reaches.
"""

from __future__ import annotations

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.sums import sum_l2_sensitivity, sum_sensitivity
from dpmagic.gate.policy import Neighbouring


def count_sensitivity(c: Contribution, neighbouring: Neighbouring) -> int:
    """L1 sensitivity of per-partition counts (and of distinct counts)."""
    return sum_sensitivity(1, 1, c, neighbouring)


def count_l2_sensitivity(c: Contribution, neighbouring: Neighbouring) -> float:
    """L2 sensitivity of per-partition counts (and of distinct counts), rounded up."""
    return sum_l2_sensitivity(1, 1, c, neighbouring)
