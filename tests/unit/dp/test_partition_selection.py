"""``dp/partition_selection``: the keys one neighbour can make appear or vanish, and
by how much each key's count of units moves, against every unit and pair of units;
a rule that forgets a replacement's second unit is caught."""

from __future__ import annotations

import itertools

import pytest

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.partition_selection import key_reach
from dpmagic.gate.policy import Neighbouring


def _reaches(partitions: int, groups: int) -> list[frozenset[int]]:
    """Every set of keys one unit can reach (its count of units is 0 or 1 per key)."""
    return [
        frozenset(s)
        for n in range(groups + 1)
        for s in itertools.combinations(range(partitions), n)
    ]


def _check(rule, partitions, groups):
    c = Contribution.bounded(groups, 1, partitions)
    every = _reaches(partitions, groups)
    l0_add = max(len(s) for s in every)
    l0_sub = max(len(a ^ b) for a in every for b in every)
    l0, linf = rule(c, Neighbouring.ADD_REMOVE)
    assert l0_add <= l0 and linf >= 1
    l0, linf = rule(c, Neighbouring.SUBSTITUTE)
    assert l0_sub <= l0 and linf >= 1
    if partitions >= 2 * groups:
        assert l0_sub == l0


@pytest.mark.parametrize(
    ("partitions", "groups"), [(p, g) for p in range(1, 6) for g in range(1, p + 1)]
)
def test_the_reach_bounds_every_neighbour(partitions, groups):
    _check(key_reach, partitions, groups)


def test_a_rule_that_forgets_the_replacing_unit_is_caught():
    def half(c, relation):
        return key_reach(c, Neighbouring.ADD_REMOVE)

    with pytest.raises(AssertionError):
        _check(half, 4, 2)
