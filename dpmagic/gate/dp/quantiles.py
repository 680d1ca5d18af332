"""Rules of the exponential mechanism behind quantiles: the score of a candidate, how
much one value moves every score, and how many values one unit moves.

**The score.** For a level ``q = num/den`` and a group of ``n`` values (each
snapped to a candidate), a candidate ``c`` with ``below`` values strictly below it
and ``here`` values at it is a true ``q``-quantile exactly when
``below ≤ q·n ≤ below + here``; its score (lower is better) is how far it is from
that, in units of ``1/den`` rank::

    score(c) = max(0, den·below − num·n, num·n − den·(below + here))

So the best score is 0 (some candidate is a true quantile), and a candidate
scoring ``den·t`` is a true quantile at some level within ``t/n`` of ``q``.
OpenDP's score, ``|(den − num)·below − num·above|``, leaves the values at a
candidate out of both sides: where many values share one (a column that is mostly
0), a candidate in the gap past them can outscore the true quantile by a
large share of ``n`` ranks, and its released median missed the true one in 79%
of groups of 55% zeros (``tests/unit/test_quantile_edges.py``). This score
counts them.

**Its sensitivity** (``score_sensitivity``): adding one value ``x`` makes ``n``
one larger and ``below`` (``x < c``) or ``here`` (``x = c``) one larger. The
first term moves by ``den − num`` (``x < c``) or ``−num``; the second by
``num − den`` (``x ≤ c``) or ``num``. ``max(0, a, b)`` moves by at most the
largest move of ``a`` and ``b``, so every score moves by at most
``max(num, den − num)``; removing a value is the same step back. It is attained
(one value added below a candidate that scores by its first term), and it is
the number OpenDP's map gives its own score, which the tests check too.

**The distance** (``selection_distance``): the exponential mechanism scores each
candidate over all partitions; each score moves by at most the sensitivity per
value added or removed. A unit brings at most ``rows`` values to each of at most
``groups`` partitions: ``groups·rows`` values added or removed. A replacement
cannot cancel (the old unit's values leave, the new one's arrive, possibly in
other places): twice that.

**One value a unit** (``unit_value_distance``): a quantile of a value each unit has
exactly one of, a function of that unit's rows alone (``--clip``'s rows per
person, ``sql/clip.py``), in one partition: a unit added or removed adds or
removes that one value, one replaced replaces it; the distance of one row in one
partition.
"""

from __future__ import annotations

from collections.abc import Mapping

from dpmagic.gate.dp.contribution import Contribution, checked_relation
from dpmagic.gate.policy import Neighbouring


def selection_distance(c: Contribution, neighbouring: Neighbouring) -> int:
    """Values one unit can add or remove over all partitions (symmetric difference)."""
    reach = c.groups * c.rows
    return reach if checked_relation(neighbouring) == Neighbouring.ADD_REMOVE else 2 * reach


def unit_value_distance(neighbouring: Neighbouring) -> int:
    """Values one unit can add or remove when it has exactly one (the module's docstring)."""
    return selection_distance(Contribution.bounded(1, 1, 1), neighbouring)


def quantile_scores(histogram: Mapping[int, int], size: int, num: int, den: int) -> list[int]:
    """The score of each candidate ``0..size-1`` at level ``num/den`` for a group holding
    ``histogram[i]`` values at candidate ``i`` (see the module's docstring)."""
    n = sum(histogram.values())
    out = []
    below = 0
    for i in range(size):
        here = histogram.get(i, 0)
        out.append(max(0, den * below - num * n, num * n - den * (below + here)))
        below += here
    return out


def score_sensitivity(num: int, den: int) -> int:
    """How much one value added or removed moves any score at level ``num/den``."""
    return max(num, den - num)
