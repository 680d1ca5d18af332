"""``dp/sums``: the L1 and L2 sensitivity of per-partition sums, against every unit
and pair of units in small cases; a rule that forgets the unit's other groups is
caught by the same search."""

from __future__ import annotations

import pytest

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.sums import sum_l2_squared, sum_sensitivity
from dpmagic.gate.policy import Neighbouring
from tests.unit.dp.brute import worst

# The largest search (three groups of two rows over (-4, -1), whose sums take nine
# values a partition: 729 units as their sums see them, 531,441 pairs) takes seconds:
# it runs with the searches (``-m search``); the same shape over the other bounds
# (216 units, 46,656 pairs) stays in the default run.
CASES = [
    pytest.param(
        partitions,
        groups,
        rows,
        bounds,
        marks=[pytest.mark.search] if (groups, rows, bounds) == (3, 2, (-4, -1)) else [],
    )
    for partitions in (1, 2, 3)
    for groups in range(1, partitions + 1)
    for rows in (1, 2)
    for bounds in ((0, 3), (-2, 3), (-4, -1), (1, 1))
]


def _sums(unit) -> tuple[int, ...]:
    return tuple(sum(cell) for cell in unit)


def _l1(sa, sb):
    sb = [0] * len(sa) if sb is None else sb
    return sum(abs(x - y) for x, y in zip(sa, sb, strict=True))


def _l2_squared(sa, sb):
    sb = [0] * len(sa) if sb is None else sb
    return sum((x - y) ** 2 for x, y in zip(sa, sb, strict=True))


def _values(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(sorted({lo, hi, max(lo, min(0, hi)), (lo + hi) // 2}))


def _check(rule, distance, partitions, groups, rows, bounds) -> None:
    lo, hi = bounds
    c = Contribution.bounded(groups, rows, partitions)
    add_remove, substitute = worst(partitions, groups, rows, _values(lo, hi), distance, _sums)
    assert add_remove == rule(lo, hi, c, Neighbouring.ADD_REMOVE)
    assert substitute == rule(lo, hi, c, Neighbouring.SUBSTITUTE)


@pytest.mark.parametrize(("partitions", "groups", "rows", "bounds"), CASES)
def test_l1_is_the_worst_change_and_attained(partitions, groups, rows, bounds):
    _check(sum_sensitivity, _l1, partitions, groups, rows, bounds)


@pytest.mark.parametrize(("partitions", "groups", "rows", "bounds"), CASES)
def test_l2_squared_is_the_worst_change_and_attained(partitions, groups, rows, bounds):
    _check(sum_l2_squared, _l2_squared, partitions, groups, rows, bounds)


def test_a_rule_that_forgets_the_other_groups_is_caught():
    def one_group(lo, hi, c, relation):
        return sum_sensitivity(lo, hi, Contribution.bounded(1, c.rows, c.partitions), relation)

    with pytest.raises(AssertionError):
        _check(one_group, _l1, 2, 2, 1, (0, 3))
