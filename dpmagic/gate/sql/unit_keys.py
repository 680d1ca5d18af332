"""Group keys a unit's rows all share: then the window keeps one group a unit.

Why. The per-query window (``rewrite.py``'s ``window``) keeps at most ``groups`` of a
unit's partitions, and the sensitivities read that bound (``dp/enforcement.window``).
With ``groups = max_partitions`` (4 in TPC-H's policy), a query grouped by the
customer's own nation pays for four nations a customer could reach, though each
reaches one: TPC-H's q5 (revenue by nation) had four times the noise it needs.

Privacy does not rest on this module. The window keeps at most one group of each
unit whatever the data (``DENSE_RANK`` over the unit's keys, ``__group <= 1``), so a
key this module wrongly called fixed would drop rows, never add a unit's reach.
What the module decides is only that keeping one loses no row: every row the query
keeps of one unit has the same key.

Rule. A column of the join is *fixed* when, among the rows the query keeps, all of
one unit's rows hold the same value in it:

1. a scan's privacy-unit column (the join ties every private scan's unit to the
   row's unit) and every column of a private scan whose table holds at most one row
   a unit (``max_rows_per_unit = 1``, and a per-person subquery's table grouped by
   the unit alone): one row of it is joined to all of the unit's rows;
2. a column a ``WHERE`` conjunct equates to a literal or to a fixed column (the rows
   kept satisfy every conjunct; inner joins' conditions are among them);
3. every column of a public scan whose unique column (a public fact: no value
   stored twice, ``Column.repeats == 1``) is fixed, by (2) or by an equality of its
   own ``LEFT JOIN`` condition to a fixed expression: at most one row of it matches,
   or none and its columns are NULL, for every row of the unit.

A group key is fixed when every column it reads is (it is a function of its row's
columns: the check pass allows no function that draws at random). The rules are
applied until nothing changes. Not used: a conjunct under ``OR`` or ``NOT``, or
another scan's ``LEFT JOIN`` condition (a row without a match is kept there with
NULLs, so its equality need not hold).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.sql.trees import conjuncts, unparen

if TYPE_CHECKING:  # resolve reads this module for its per-person subqueries
    from dpmagic.gate.sql.resolve import Resolved, Scan

ColumnKey = tuple[str, str]  # (scan name, column name)


def keys_fixed_by_unit(resolved: Resolved, keys: Sequence[exp.Expression]) -> bool:
    """Whether every one of ``keys`` (group keys, columns qualified by their scans) is
    the same for all the rows the query keeps of one unit (the module's rule)."""
    if resolved.unit is None or not keys:
        return False
    where = resolved.tree.args.get("where")
    terms = conjuncts(where.this) if where is not None else []
    return fixed_by_unit(resolved.scans, terms, keys)


def fixed_by_unit(
    scans: Sequence[Scan], terms: Sequence[exp.Expression], keys: Sequence[exp.Expression]
) -> bool:
    """Whether every one of ``keys`` is fixed by the unit in the join of ``scans`` under
    the conjuncts ``terms`` (a query's, or a per-person subquery's own)."""
    fixed = fixed_columns(scans, terms)
    return all(_reads_only(key, fixed) for key in keys)


def fixed_columns(scans: Sequence[Scan], terms: Sequence[exp.Expression]) -> frozenset[ColumnKey]:
    """The columns of the join of ``scans`` fixed by its unit (rules 1 to 3)."""
    main = {s.name for s in scans}
    pairs, held = _equalities(terms, main)
    fixed: set[ColumnKey] = set(held)
    for scan in scans:
        fixed |= _fixed_by_rows(scan)
    changed = True
    while changed:
        changed = False
        for a, b in pairs:
            if (a in fixed) != (b in fixed):
                fixed |= {a, b}
                changed = True
        for scan in scans:
            if _whole_scan(scan, fixed) or not _keyed_public(scan, fixed):
                continue
            fixed |= {(scan.name, c) for c in scan.table.columns}
            changed = True
    return frozenset(fixed)


def _fixed_by_rows(scan: Scan) -> set[ColumnKey]:
    """Rule 1: a private scan's unit column; all of one holding a row a unit (a
    per-person subquery's table, grouped by the unit alone, is one)."""
    table = scan.table
    if table.public or table.unit is None:
        return set()
    if table.max_rows == 1:
        return {(scan.name, c) for c in (*table.columns, table.unit)}
    return {(scan.name, table.unit)}


def _keyed_public(scan: Scan, fixed: set[ColumnKey]) -> bool:
    """Rule 3: a public scan whose unique column is fixed, in the ``WHERE`` or by its
    own ``LEFT JOIN`` condition's equality to a fixed expression."""
    if not scan.table.public:
        return False
    unique = {n for n, c in scan.table.columns.items() if c.repeats == 1}
    if any((scan.name, n) in fixed for n in unique):
        return True
    if scan.kind != "left" or scan.on is None:
        return False
    for term in conjuncts(scan.on):
        if not isinstance(term, exp.EQ):
            continue
        for own, other in ((term.this, term.expression), (term.expression, term.this)):
            own = unparen(own)
            if (
                isinstance(own, exp.Column)
                and own.table == scan.name
                and own.name in unique
                and _reads_only(other, fixed)
                and not any(c.table == scan.name for c in other.find_all(exp.Column))
            ):
                return True
    return False


def _whole_scan(scan: Scan, fixed: set[ColumnKey]) -> bool:
    return all((scan.name, c) in fixed for c in scan.table.columns)


def _equalities(
    terms: Iterable[exp.Expression], main: set[str]
) -> tuple[list[tuple[ColumnKey, ColumnKey]], set[ColumnKey]]:
    """Rule 2's facts: conjuncts equating two columns, and columns held to a literal;
    of the join's own scans only (not a semi-join's: its conditions hold of some row
    of it, or, under ``NOT EXISTS``, of none)."""
    pairs: list[tuple[ColumnKey, ColumnKey]] = []
    held: set[ColumnKey] = set()
    for term in terms:
        term = unparen(term)
        if not isinstance(term, exp.EQ):
            continue
        left, right = unparen(term.this), unparen(term.expression)
        if any(c.table not in main for c in term.find_all(exp.Column)):
            continue
        if isinstance(left, exp.Column) and isinstance(right, exp.Column):
            pairs.append((_key(left), _key(right)))
        elif isinstance(left, exp.Column) and isinstance(right, exp.Literal):
            held.add(_key(left))
        elif isinstance(right, exp.Column) and isinstance(left, exp.Literal):
            held.add(_key(right))
    return pairs, held


def _reads_only(node: exp.Expression, fixed: set[ColumnKey] | frozenset[ColumnKey]) -> bool:
    """Whether every column ``node`` reads is fixed (a literal reads none)."""
    return all(_key(c) in fixed for c in node.find_all(exp.Column))


def _key(column: exp.Column) -> ColumnKey:
    return (column.table, column.name)
