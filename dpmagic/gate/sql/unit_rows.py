"""The rows each person brings to a query, as one value a person: what ``--clip``
chooses a query's rows per person from (``sql/clip.py``).

The value stands in a quantile's and a count's place in the plan (their argument is
``marker()``), but it is not a row expression: the rewrite computes it per unit over
the query's bounded rows (``rewrite._unit_rows``), one value a unit, so the
selection's distance is one value's (``dp.quantiles.unit_value_distance``); the count
is of the distinct units among those rows, one a unit (``dp.counts.distinct_units``),
not the ``groups·rows`` of an aggregate over rows. The plan is of the first release of
``--clip``, without group keys: one partition.
"""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.sql.value_range import ValueRange

NAME = "__dpmagic_unit_rows"


def marker() -> exp.Column:
    """The argument of the rows-per-person quantile. Resolved columns are qualified by
    their scan, so no column of a query can be taken for this one."""
    return exp.column(NAME)


def is_marker(arg: exp.Expression | None) -> bool:
    return isinstance(arg, exp.Column) and arg.name == NAME and not arg.table


def candidates(most: int) -> ValueRange:
    """The counts a person's rows can take among the query's bounded rows, 1 to ``most``
    (the rewrite caps each at ``most``)."""
    return ValueRange(1, most, True)
