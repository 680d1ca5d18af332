"""Rule: counts and distinct counts are sums of ones.

``COUNT(*)`` and ``COUNT(x)`` add 1 for each of a unit's counted rows: per-partition
sums of values in ``[1, 1]``, whose sensitivity ``sums`` gives. ``COUNT(DISTINCT
x)`` changes by at most the number of distinct values a unit brings to a
partition, which is at most its ``rows`` rows there: the same bound. ``COUNT(DISTINCT
unit)`` is the case ``rows = 1`` (``distinct_units``): a unit is one value in each
partition it reaches, however many rows it has there, and it reaches at most ``groups``
partitions. That needs ``groups`` to bound the partitions a unit reaches, which the
per-query window (and row level) gives; the load-time ranks' contribution (``K`` rows
as if in one partition, ``dp/enforcement``) bounds sums only, since ``K`` rows may lie
in ``K`` partitions, one unit each: so ``sql/ranks.bounding`` takes the window for a
count of distinct units.
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


def distinct_units(c: Contribution) -> Contribution:
    """What one unit contributes to ``COUNT(DISTINCT unit)`` per partition: 1 in each of the
    ``c.groups`` partitions it may reach (the rule above), whose count sensitivities are
    ``count_sensitivity`` of this."""
    return Contribution(c.groups, 1, c.partitions)
