"""``dp/counts``: counts and distinct counts, against every unit in small cases; a
count rule that ignores how many rows a unit has in a partition is caught."""

from __future__ import annotations

import pytest

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.counts import count_sensitivity
from dpmagic.gate.policy import Neighbouring
from tests.unit.dp.brute import worst

CASES = [(p, g, r) for p in (1, 2, 3) for g in range(1, p + 1) for r in (1, 2, 3)]


def _change(ma, mb):
    mb = [0] * len(ma) if mb is None else mb
    return sum(abs(x - y) for x, y in zip(ma, mb, strict=True))


def _check(rule, measure, partitions, groups, rows, values) -> None:
    c = Contribution.bounded(groups, rows, partitions)
    add_remove, substitute = worst(
        partitions, groups, rows, values, _change, lambda u: tuple(measure(cell) for cell in u)
    )
    assert add_remove <= rule(c, Neighbouring.ADD_REMOVE)
    assert substitute <= rule(c, Neighbouring.SUBSTITUTE)
    return add_remove, substitute


@pytest.mark.parametrize(("partitions", "groups", "rows"), CASES)
def test_a_count_changes_by_at_most_its_sensitivity_which_is_attained(partitions, groups, rows):
    c = Contribution.bounded(groups, rows, partitions)
    got = _check(count_sensitivity, len, partitions, groups, rows, (1,))
    assert got == (count_sensitivity(c, Neighbouring.ADD_REMOVE),
                   count_sensitivity(c, Neighbouring.SUBSTITUTE))  # fmt: skip


@pytest.mark.parametrize(("partitions", "groups", "rows"), CASES)
def test_a_distinct_count_changes_by_at_most_the_count_sensitivity(partitions, groups, rows):
    _check(count_sensitivity, lambda cell: len(set(cell)), partitions, groups, rows, (1, 2, 3))


def test_a_rule_that_counts_one_row_per_partition_is_caught():
    def one_row(c, relation):
        return count_sensitivity(Contribution.bounded(c.groups, 1, c.partitions), relation)

    with pytest.raises(AssertionError):
        _check(one_row, len, 1, 1, 2, (1,))
