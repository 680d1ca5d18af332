"""Per-person pre-aggregation (issue 41 item 2): the bounds of a subquery grouped by
the privacy unit, decided from the policy and the query's text alone.

``SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id`` computes one
exact value per person; the query around it may then aggregate over persons, each
person one row of the derived table. That is sound only if every per-person value
lies within a bound known before the data is read, because the outer aggregate's
sensitivity is that bound. The bound comes from the inner rows a person may have
(``Table.max_rows``, enforced by the contribution bounding that caps a person's rows
before the per-person aggregation, so it is a fact by construction, not a trust) and
from the range of the aggregated expression (declared bounds or the analyst's clamp):

    ===================  ==============================================
    per-person value     lies within (rows = a person's row bound)
    ===================  ==============================================
    COUNT(*), COUNT(x)   [0, rows]
    COUNT(DISTINCT x)    [0, rows]
    SUM(x), x in [a, b]  [rows * min(a, 0), rows * max(b, 0)]
    AVG(x), MIN, MAX     [a, b]
    ===================  ==============================================

A sum of k ≤ rows values each in [a, b] lies in [k·a, k·b], inside the table's
interval for every k, including k = 0 (a person kept by a LEFT JOIN, or whose rows a
filter removed). Using the declared column range [a, b] for a SUM would underestimate
it by a factor of ``rows``: the brute force in the unit tests catches exactly that.

An integral per-person value with finite bounds is a public key (``keys``): its
values are the integers of the bound, known without the data, so ``GROUP BY n``
around it is a histogram over declared keys.

Whether a grouping key "lies within one unit" is a predicate (``WithinUnit``), which
the resolver gives (``resolve._Flattener.per_unit``: the key reads a unit column);
the resolver also requires it to be the only key, so that each row is one person's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import Column, ColumnType, Table
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.value_range import ValueRange

# Does this grouping key (a column of the scanned table) lie within one unit?
WithinUnit = Callable[[exp.Expression], bool]
# The declared or clamped range of a row expression inside the subquery.
RowRange = Callable[[exp.Expression], ValueRange | None]

# The most integer keys a per-person value may offer as public keys.
MAX_KEYS = 10_000


@dataclass(frozen=True)
class PerUnitValue:
    """One output column of a per-person subquery: where its value lies, and why
    (``basis``, from the policy and the query's text only, for the dry run)."""

    name: str
    range: ValueRange
    basis: str


def grouped_by_unit(select: exp.Select, within: WithinUnit) -> bool:
    """A subquery is per-person when one of its grouping keys lies within one unit:
    every group then holds rows of one person only."""
    group = select.args.get("group")
    return group is not None and any(within(k) for k in group.expressions)


def per_unit_values(
    select: exp.Select, rows: int, within: WithinUnit, row_range: RowRange
) -> list[PerUnitValue]:
    """The bound of each output column of a per-person ``select``. ``rows`` is the
    most rows one unit has in the subquery's FROM after its joins (a join of two of a
    unit's tables multiplies their bounds), as the caller's contribution bounding
    enforces. Refuses what has no bound; names only the query's text."""
    if not grouped_by_unit(select, within):
        raise Refused("a subquery in FROM with GROUP BY must group by the privacy unit")
    if rows < 1:
        raise Refused("a per-person subquery needs the table's rows per unit declared")
    out = []
    for item in select.expressions:
        name = item.alias_or_name
        node = item.this if isinstance(item, exp.Alias) else item
        if within(node):
            continue  # the unit's own key: never released, only grouped on
        value = value_bound(node, rows, row_range)
        if value is None:
            raise Refused(
                f"{node.sql(dialect=DIALECT)[:60]} has no bound per person: use COUNT, or "
                "SUM, AVG, MIN or MAX of a column with declared bounds, or clamp it with "
                "LEAST/GREATEST"
            )
        out.append(PerUnitValue(name, value[0], value[1]))
    return out


def keys_of(value: PerUnitValue) -> range:
    """The public keys of an integral, bounded per-person value: every integer of its
    bound, none read from the data. Refuses a value that cannot be a key."""
    r = value.range
    if not (r.integral and r.finite):
        raise Refused(f"{value.name} is not an integer with finite bounds: it cannot be a key")
    if r.hi - r.lo + 1 > MAX_KEYS:
        raise Refused(f"{value.name} has more than {MAX_KEYS} possible values: clamp it")
    return range(int(r.lo), int(r.hi) + 1)


def derived_table(
    name: str,
    unit: Column,
    values: list[PerUnitValue],
    keys: Sequence[Column] = (),
    max_rows: int = 1,
) -> Table:
    """The per-person subquery as the query around it sees it: a private table of at
    most ``max_rows`` rows per unit (one where it is grouped by the unit alone, or by
    keys the unit fixes) whose ``keys`` are declared as the columns they read are,
    and whose values are declared by their per-person bounds, an integral one's keys
    declared as its public values. The outer query's sensitivity then follows from
    the existing rules for a declared table, because adding or removing a person adds
    or removes at most ``max_rows`` rows within those bounds."""
    columns = {unit.name: Column(unit.name, unit.type)}
    columns.update({k.name: k for k in keys})
    for v in values:
        try:
            public = tuple(keys_of(v))
        except Refused:
            public = None
        kind: ColumnType = "int" if v.range.integral else "float"
        columns[v.name] = Column(v.name, kind, v.range.lo, v.range.hi, public_values=public)
    return Table(name, public=False, columns=columns, unit=unit.name, max_rows=max_rows)


def value_bound(
    node: exp.Expression, rows: int, row_range: RowRange
) -> tuple[ValueRange, str] | None:
    """Where one per-person value lies (the table above), and why; None if unbounded."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Count):
        return ValueRange(0, rows, True), f"{_text(node)} in [0, {rows}]: {_rows(rows)} per unit"
    if isinstance(node, exp.Sum | exp.Avg | exp.Min | exp.Max):
        arg = row_range(node.this)
        if arg is None or not arg.finite:
            return None
        if isinstance(node, exp.Sum):
            lo, hi = rows * min(arg.lo, 0), rows * max(arg.hi, 0)
            why = f"{_rows(rows)} per unit × [{_num(arg.lo)}, {_num(arg.hi)}]"
            return ValueRange(
                lo, hi, arg.integral
            ), f"{_text(node)} in [{_num(lo)}, {_num(hi)}]: {why}"
        integral = arg.integral and not isinstance(node, exp.Avg)
        why = f"{_text(node)} in [{_num(arg.lo)}, {_num(arg.hi)}]: the argument's range"
        return ValueRange(arg.lo, arg.hi, integral), why
    if isinstance(node, exp.Greatest | exp.Least):
        return _clamp(node, rows, row_range)
    return None


def _clamp(
    node: exp.Greatest | exp.Least, rows: int, row_range: RowRange
) -> tuple[ValueRange, str] | None:
    """``LEAST(GREATEST(agg, a), b)``: the analyst's clamp of a per-person value,
    bounded by the hull of its arguments narrowed by the constant ones."""
    args: Sequence[exp.Expression] = [node.this, *node.expressions]
    parts = []
    for a in args:
        constant = _constant(a)
        if constant is not None:
            parts.append(constant)
            continue
        inner = value_bound(a, rows, row_range)
        if inner is None:
            return None
        parts.append(inner[0])
    integral = all(p.integral for p in parts)
    if isinstance(node, exp.Least):
        lo, hi = min(p.lo for p in parts), min(p.hi for p in parts)
    else:
        lo, hi = max(p.lo for p in parts), max(p.hi for p in parts)
    return ValueRange(lo, hi, integral), f"{_text(node)} in [{_num(lo)}, {_num(hi)}]: clamped"


def _constant(node: exp.Expression) -> ValueRange | None:
    """A number written in the query (``4``, ``-1``): public, its own range."""
    sign = 1
    while isinstance(node, exp.Neg | exp.Paren):
        sign = -sign if isinstance(node, exp.Neg) else sign
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    v = sign * float(node.this)
    return ValueRange(v, v, node.is_int)


def _rows(rows: int) -> str:
    return f"{rows} row" if rows == 1 else f"{rows} rows"


def _text(node: exp.Expression) -> str:
    return node.sql(dialect=DIALECT)[:60]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))
