"""``dp/quantiles``: how much one value moves a quantile's scores, against every small
histogram, and the values one unit moves in the multisets a quantile scores, against
every unit and pair of units; rules that under-estimate either are caught."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.quantiles import quantile_scores, score_sensitivity, selection_distance
from dpmagic.gate.policy import Neighbouring
from tests.unit.dp.brute import worst


def _moved(a, b):
    """Size of the symmetric difference of the two units' (partition, value) multisets."""
    ca = Counter((p, v) for p, cell in enumerate(a) for v in cell)
    cb = Counter() if b is None else Counter((p, v) for p, cell in enumerate(b) for v in cell)
    return sum(((ca - cb) + (cb - ca)).values())


def _check(rule, partitions, groups, rows):
    c = Contribution.bounded(groups, rows, partitions)
    add_remove, substitute = worst(partitions, groups, rows, (0, 1, 2), _moved)
    assert add_remove == rule(c, Neighbouring.ADD_REMOVE)
    # Attained: the replacing unit's values differ from the replaced one's.
    assert substitute == rule(c, Neighbouring.SUBSTITUTE)


@pytest.mark.parametrize(
    ("partitions", "groups", "rows"),
    [(p, g, r) for p in (1, 2, 3) for g in range(1, p + 1) for r in (1, 2) if p * r <= 4],
)
def test_the_distance_is_the_worst_and_attained(partitions, groups, rows):
    _check(selection_distance, partitions, groups, rows)


def test_a_rule_where_a_replacement_cancels_is_caught():
    def cancelling(c, relation):
        return selection_distance(c, Neighbouring.ADD_REMOVE)

    with pytest.raises(AssertionError):
        _check(cancelling, 1, 1, 1)


def _histograms(size: int, most: int):
    """Every histogram of at most ``most`` values over ``size`` candidates."""
    for n in range(most + 1):
        for values in itertools.combinations_with_replacement(range(size), n):
            yield Counter(values)


def _worst_move(num: int, den: int, size: int = 3, most: int = 4) -> int:
    """The most any score moves when one value is added to any small histogram."""
    worst = 0
    for h in _histograms(size, most):
        before = quantile_scores(h, size, num, den)
        for x in range(size):
            after = quantile_scores(h + Counter([x]), size, num, den)
            worst = max(worst, max(abs(a - b) for a, b in zip(after, before, strict=True)))
    return worst


@pytest.mark.parametrize(("num", "den"), [(0, 1), (1, 1), (1, 2), (1, 3), (2, 3), (1, 4), (3, 5)])
def test_the_score_sensitivity_is_the_worst_move_and_attained(num, den):
    assert _worst_move(num, den) == score_sensitivity(num, den)


def test_a_sensitivity_that_forgets_one_side_is_caught():
    def below_only(num: int, den: int) -> int:
        return den - num

    def above_only(num: int, den: int) -> int:
        return num

    assert _worst_move(3, 4) > below_only(3, 4)
    assert _worst_move(1, 4) > above_only(1, 4)
