"""``dp/quantiles``: the values one unit moves in the multisets a quantile scores,
against every unit and pair of units; a rule that lets a replacement cancel is
caught."""

from __future__ import annotations

from collections import Counter

import pytest

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.quantiles import selection_distance
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
