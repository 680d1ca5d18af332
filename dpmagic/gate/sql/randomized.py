"""Columns collected by randomized response: what may be asked of them, and how
their answers are debiased.

A column declared ``randomized_response = { p = … }`` holds reported values:
each respondent gave their true value with probability ``p``, else one drawn
uniformly from the column's ``k`` public values. Reported values are pulled
towards the uniform, and a query over them is only useful once that pull is
undone. The gate undoes it where the expectation of a DP measurement is a
known linear function of the truth:

* ``COUNT(*)`` or ``COUNT(column)`` grouped by the column (alone or with other
  public keys): within one group of the other keys, with ``n`` reports of which
  ``c_v`` say ``v``, ``E[c_v] = p·t_v + (1−p)·n/k``, so ``t_v = (c_v − n(1−p)/k)/p``.
* ``SUM(column)`` and ``AVG(column)`` over numeric values: a report's
  expectation is ``p·x + (1−p)·m`` with ``m`` the mean of the public values.

Every other use of the column (in WHERE, a join, an expression, MIN/MAX,
COUNT(DISTINCT), beside other aggregates in a GROUP BY over it) is refused by
:func:`debiasing`, from the query and the policy alone, before data is read.

Debiasing (:func:`debias`) is post-processing of the noisy measurements, by each
kind's estimator (``Aggregate.debias``, ``aggregates/debiasing.py``, which says how
its interval is approximated); which kinds are debiased, and how, each kind says
(``Aggregate.debiasing``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.failures import Refused, required
from dpmagic.gate.sql.aggregates.debiasing import Debias, Debiased, Debiasing, Values
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.trees import unparen

if TYPE_CHECKING:
    from dpmagic.gate.policy import Column
    from dpmagic.gate.sql.check import Checked

SUPPORTED = "supported: COUNT(*) or COUNT(column) grouped by it, SUM and AVG of it"


def debiasing(checked: Checked) -> dict[str, Debias]:
    """The aggregates to debias, by name; refuses every unsupported use of a
    randomized-response column. Reads only the query and the policy."""
    mentioned = _refuse_outside_aggregates_and_keys(checked)
    if not mentioned:
        return {}
    if len(checked.resolved.scans) > 1:
        raise Refused(
            f"{mentioned[0]!r} is collected by randomized response: query its table alone, "
            f"without joins ({SUPPORTED})"
        )
    grouped = [(i, c) for i, k in enumerate(checked.keys) if (c := _bare(k.expr, checked))]
    if len(grouped) > 1:
        raise Refused("GROUP BY one randomized-response column at a time")
    if grouped:
        return _grouped_counts(checked, *grouped[0])
    out = {}
    for agg in checked.aggregates:
        col = _bare(agg.arg, checked) if agg.arg is not None else None
        if col is None:
            continue
        how = kind_of(agg.func).debiasing
        if how is None:
            raise Refused(f"{agg.label}: {col.name!r} is collected by randomized "
                          f"response; {SUPPORTED}")  # fmt: skip
        if how is Debiasing.PER_ANSWER:
            continue  # whether an answer was given is not randomized
        values = col.public_values or ()
        if not all(_number(v) for v in values):
            raise Refused(f"{agg.label}: SUM and AVG of a randomized-response column need "
                          "numeric public_values")  # fmt: skip
        numbers = tuple(float(v) for v in values)  # type: ignore[arg-type]
        p = required(col.randomized_response, "a randomized column's probability").p
        out[agg.name] = Debias(agg.func, p, len(values), None, numbers)
    return out


def _grouped_counts(checked: Checked, key: int, col: Column) -> dict[str, Debias]:
    """GROUP BY the column: every aggregate must be a count of rows or of a column."""
    randomized = required(col.randomized_response, "a randomized column's probability")
    for agg in checked.aggregates:
        counted = agg.arg is None or isinstance(unparen(agg.arg), exp.Column)
        if kind_of(agg.func).debiasing is not Debiasing.PER_ANSWER or not counted:
            raise Refused(
                f"{agg.label} beside GROUP BY {col.name} (randomized response): only "
                "COUNT(*) and COUNT(column) are debiased per answer"
            )
    p, k = randomized.p, len(col.public_values or ())
    return {agg.name: Debias(AggregateFunc.COUNT, p, k, key) for agg in checked.aggregates}


def _refuse_outside_aggregates_and_keys(checked: Checked) -> list[str]:
    """Refuse a randomized-response column anywhere but bare in a group key or an
    aggregate's argument; returns the names of those it finds there."""
    resolved = checked.resolved
    places: list[tuple[str, exp.Expression | None]] = [("in WHERE or JOIN … ON", checked.where)]
    places += [("in a join condition", s.on) for s in resolved.scans]
    for j in resolved.semijoins:
        places += [("in IN (SELECT …)", j.lhs), ("in IN (SELECT …)", j.value)]
        places.append(("in IN (SELECT …)", j.where))
    for where, node in places:
        col = _first(node, checked)
        if col is not None:
            raise Refused(f"{col.name!r} is collected by randomized response and cannot be "
                          f"used {where}; {SUPPORTED}")  # fmt: skip
    mentioned = []
    exprs: list[tuple[str, exp.Expression | None]] = [(k.label, k.expr) for k in checked.keys]
    exprs += [(a.label, a.arg) for a in checked.aggregates]
    for label, node in exprs:
        col = _first(node, checked)
        if col is None:
            continue
        if _bare(node, checked) is None:
            raise Refused(f"{label}: {col.name!r} is collected by randomized response and "
                          f"cannot be used inside an expression; {SUPPORTED}")  # fmt: skip
        mentioned.append(col.name)
    return mentioned


def _first(node: exp.Expression | None, checked: Checked) -> Column | None:
    """The first randomized-response column ``node`` reads, if any."""
    if node is None:
        return None
    for n in node.find_all(exp.Column):
        col = checked.resolved.column(n)
        if col is not None and col.randomized_response is not None:
            return col
    return None


def _bare(node: exp.Expression | None, checked: Checked) -> Column | None:
    """The randomized-response column ``node`` is, if it is one and nothing more."""
    if node is None:
        return None
    col = checked.resolved.column(unparen(node))
    return col if col is not None and col.randomized_response is not None else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def debias(d: Debias, first: Values, second: Values | None, groups: list[list[int]]) -> Debiased:
    """Debias one aggregate from its noisy measurements, one value per partition:
    the count vector (counts), or the sum and count vectors (sums, averages), by its
    kind's estimator (``Aggregate.debias``). ``groups`` lists, for counts, the
    partitions that differ only in the randomized key: its k reported values within
    one group of the other keys."""
    return kind_of(d.func).debias(d, first, second, groups)
