"""The work one unit can add to a query, bounded from the plan before the debit.

After the debit a query can end only by running out of time or memory, so how
long it runs and how much memory it takes must not hinge on one unit: if one
unit could add seconds of work, whether a query times out (or how long its
reply takes, beyond the padding quantum) would say whether that unit is in the
data, at any ε. This module bounds, before anything is charged, what one unit
adds, and the plan refuses (free) a query whose bound is above the policy's
``max_unit_work``.

The bound is a product of two factors, each a function of the query and the
policy alone:

**Rows.** Every intermediate result of the generated SQL holds, of one unit
``u``, only rows whose private parts are ``u``'s (``resolve`` proves a join's
private rows share their unit). Its private scans keep at most ``cap`` joined
rows of ``u`` (``ranks.room_reads``: ``cap`` is the plan's ``K`` under
the ranks and the load cap otherwise), whatever order the engine joins them in:
a join of a subset of the scans has at most the product of their factors, each
at least 1, which is at most ``cap``. A public table multiplies each of those
rows by at most its *fan-out*: the rows of the public table one row can match,
which is its row count, or, where the join has a conjunct ``p.c = e`` with
``e`` reading no column of ``p`` and of ``c``'s declared type, the most rows of
``p`` sharing one value of ``c`` (``Column.repeats``, read at start: a public
table's contents are public). A semi-join's subquery over private tables holds
at most ``load cap × its public fan-outs`` rows of ``u`` the same way; one over
public tables only does not depend on ``u`` at all. An ``EXISTS`` that compares its
rows with the query's row (``SemiJoin.correlated``: allowed only when its tie keeps
both rows ``u``'s) is, at its worst, a nested loop over ``u``'s rows: each of ``u``'s
rows in the query around it against each of ``u``'s rows in the subquery, a pair
each. Aggregation, the window's sorts and the final result only consume these rows.

**Steps per row.** Each such row is worked on by the query's row expressions
(``WHERE`` and ``ON`` conditions, group keys, aggregate arguments, the
quantiles' grid snap, the unit), the join that built it (``JOIN_STEPS`` a scan)
and the window that bounds it; an expression the SQL evaluates under ``TRY``
costs a vector of rows on DuckDB's slow path (``VECTOR_ROWS``), since a row
that raises sends its whole vector, other units' rows with it, through it. A
*step* is one operator on one value, about 3 ns of DuckDB's time; each node
costs its worst-case price (``prices.py``: one step plus its per-character work
as a function of its inputs' size bounds, from ``bound.text_length``). Steps are
counted on the plan's trees, an upper bound on what the generated SQL evaluates
per row (it evaluates each of them at most once a row). A text any
concatenation or case mapping may make longer than the dataset's
``max_text_length`` is refused, so no row carries one; and one row's price,
with the slow path's under ``TRY``, must stay within ``max_row_work``, which
keeps a vector of rows (DuckDB checks for an interrupt only between vectors)
within the padding quantum.

``work = rows × steps`` summed over the query's joins (the main one, each
semi-join over private tables, and each correlated one's pairs).
``benchmarks/per_unit_work.py`` measures what a step costs per shape on each
engine (about 3 ns on DuckDB); the default ``max_unit_work``, 2^24, keeps one
unit's added time well under the default padding quantum (docs/security.md).
The rows are a proof; the steps are a cost model, calibrated on those
measurements and checked against them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused, required
from dpmagic.gate.policy.values import VECTOR_ROWS
from dpmagic.gate.sql.bound import text_length
from dpmagic.gate.sql.check import CONCATENATION
from dpmagic.gate.sql.keyed import keyed_rooms
from dpmagic.gate.sql.prices import price
from dpmagic.gate.sql.resolve import Resolved, Scan, SemiJoin
from dpmagic.gate.sql.totality import BOOLEAN_LIKE, kind, may_raise
from dpmagic.gate.sql.trees import conjuncts, display

# Steps a quantile's argument costs to snap to its grid (``rewrite._snap``: a cast, a
# clamp, a division, a rounding, two bounds and a NULL test).
SNAP_STEPS = 12
# Steps per row of the window that bounds a unit's rows after its joins: a hash and a
# place in two sorts (``rewrite.bound_contributions``).
WINDOW_STEPS = 8
# Steps a joined row costs per scan it is made of: a hash probe and its columns copied
# (a 10-scan self-join with a public table: 2.7 µs a joined row on DuckDB, about 900
# steps at the 3 ns a step measures elsewhere).
JOIN_STEPS = 100
# An expression evaluated under ``TRY`` (``totality``): on the row that raises, DuckDB
# evaluates that row's whole vector again row by row, other units' rows included, so
# each of one unit's rows may cost a vector of rows on the slow path (1.3–1.8 ms a
# failing row where its vectors are shared, ``benchmarks/per_unit_work.py``).
TRY_ROW_STEPS = 300  # a row on the slow path, beyond its expression's own steps


@dataclass(frozen=True)
class Join:
    """One join the SQL runs over private rows: the most rows one unit adds to any of
    its intermediate results, the most steps each of those rows adds to the query,
    and the most steps one row of a vector costs the engine (``row``: its own
    evaluation, plus the slow path's where it runs under ``TRY``)."""

    rows: int
    steps: int
    row: int

    @property
    def work(self) -> int:
        return self.rows * self.steps


@dataclass(frozen=True)
class Work:
    """The work one unit can add to a query (see the module's docstring): the main
    join's and each private semi-join's. ``keyed``: whether its joins read their keyed
    scans by the keyed rule (``sql/keyed.py``), priced so; the plan falls back to the
    product rule where that price is above the policy's and the product's is not."""

    joins: tuple[Join, ...]
    keyed: bool = True

    @property
    def rows(self) -> int:
        return sum(j.rows for j in self.joins)

    @property
    def total(self) -> int:
        return sum(j.work for j in self.joins)

    @property
    def row(self) -> int:
        """The dearest row of any of the joins (``max_row_work`` bounds it)."""
        return max(j.row for j in self.joins)

    def as_dict(self) -> dict[str, int]:
        return {"rows": self.rows, "steps": self.total, "row_steps": self.row}


@dataclass(frozen=True)
class Evaluation:
    """What one row's evaluation of an expression costs: ``unit``, counted against one
    unit's work (a vector of rows on the slow path under ``TRY``, since other units'
    rows go through it too); ``row``, the engine's time on that row in a vector (its
    own steps, and again with ``TRY_ROW_STEPS`` on the slow path)."""

    unit: int
    row: int


def unit_work(
    resolved: Resolved,
    cap: int,
    load_cap: int,
    trees: list[exp.Expression],
    quantiles: int,
    windowed: bool,
    keyed: bool = True,
    sorts: int = 0,
) -> Work:
    """The bound for a query whose private scans keep at most ``cap`` joined rows of a
    unit (``ranks.join_cap``; 1 without a unit, when each row is its own), whose
    row expressions are ``trees`` (keys, aggregate arguments, the unit), with
    ``quantiles`` grid snaps, ``sorts`` ranks of each row among its group's values
    (a trimmed sum's, ``aggregates.trimmed_mean``: a place in a sort and a count, as
    the window's) and, if ``windowed``, the window after its joins; with ``keyed``,
    its joins' keyed scans read by the keyed rule."""
    rooms = _keyed if keyed else _unkeyed
    where = resolved.tree.args.get("where")
    terms = conjuncts(where.this) if where is not None else []
    on = [s.on for s in resolved.scans if s.on is not None]
    probes = [j.lhs for j in resolved.semijoins]
    found = [evaluated(t, resolved) for t in [*trees, *probes]]
    found += [evaluated(t, resolved, condition=True) for t in [*terms, *on]]
    fixed = quantiles * SNAP_STEPS + sorts * WINDOW_STEPS + (WINDOW_STEPS if windowed else 0)
    fixed += JOIN_STEPS * len(resolved.scans)
    rows = cap * rooms(resolved.scans, terms, resolved, cap)
    rows *= _fan_out(resolved.scans, terms, resolved)
    joins = [_join(rows, found, fixed)]
    rows_of = {s.name: rows for s in resolved.scans}  # a scan -> its join's rows of a unit
    for per in (s.per_unit for s in resolved.scans if s.per_unit is not None):
        # A per-person subquery's own join: each unit keeps at most ``per.rows`` rows,
        # times its public fan-outs, each worked on by its filters and its aggregates'
        # arguments, and grouped (a hash and a place, as the window's).
        inner = conjuncts(per.where) if per.where is not None else []
        inner_on = [s.on for s in per.scans if s.on is not None]
        own = [evaluated(per.unit, resolved)]
        own += [evaluated(k, resolved) for _, k in per.keys]  # grouped by with the unit
        own += [evaluated(a, resolved) for _, v in per.values for a in _arguments(v)]
        own += [evaluated(t, resolved, condition=True) for t in [*inner, *inner_on]]
        rows = per.rows * rooms(per.scans, inner, resolved, per.rows)
        rows *= _fan_out(per.scans, inner, resolved)
        joins.append(_join(rows, own, JOIN_STEPS * len(per.scans) + WINDOW_STEPS))
    for j in resolved.semijoins:
        if all(s.table.public for s in j.scans):
            continue  # the subquery reads no unit's rows: the same on every dataset
        inner = conjuncts(j.where) if j.where is not None else []
        inner_on = [s.on for s in j.scans if s.on is not None]
        semi = [evaluated(j.value, resolved)]
        semi += [evaluated(t, resolved, condition=True) for t in [*inner, *inner_on]]
        if j.having is not None:
            semi += [evaluated(a, resolved) for a in _arguments(j.having)]
        rows = load_cap * rooms(j.scans, inner, resolved, load_cap)
        rows *= _fan_out(j.scans, inner, resolved)
        rows_of.update((s.name, rows) for s in j.scans)
        grouping = WINDOW_STEPS if j.grouped else 0
        joins.append(_join(rows, semi, JOIN_STEPS * len(j.scans) + grouping))
    # After every semi-join's own rows: a nested one's outer rows are those of the
    # semi-join it sits in, which comes later in the list.
    joins += [_pairs(j, rows_of, resolved) for j in resolved.semijoins if j.correlated]
    return Work(tuple(joins), keyed)


def _keyed(
    scans: tuple[Scan, ...], terms: list[exp.Expression], resolved: Resolved, cap: int
) -> int:
    """What a join's keyed scans (``sql/keyed.py``) may multiply a unit's rows by in a
    join the engine orders otherwise: a keyed scan joined on the unit alone, before
    its partner, holds its room's rows for each row it meets. The product of their
    rooms (1 without keyed scans); the joined rows that are aggregated stay within
    ``cap`` (``dp/join_bounding.py``)."""
    private = [s for s in scans if not s.table.public and s.per_unit is None]
    private = [s for s in private if s.table.unit is not None]
    product = 1
    for room in keyed_rooms(private, terms, resolved.dataset, cap):
        product *= room or 1
    return product


def _unkeyed(*_: object) -> int:
    """The product rule alone: no keyed scan, nothing more than ``cap``."""
    return 1


def _pairs(j: SemiJoin, rows_of: dict[str, int], resolved: Resolved) -> Join:
    """The pairs an ``EXISTS`` comparing its rows with the query's row works on: one
    unit's rows around it (the most of the joins whose scans it compares with) times
    the unit's rows in it, each pair a probe (``JOIN_STEPS``) worked on by the tie and
    the comparisons. The engine joins on the tie's equality, so this is its worst."""
    correlated = required(j.correlated, "a correlated semi-join's conditions")
    own = {s.name for s in j.scans}
    read = {c.table for t in (j.lhs, correlated) for c in t.find_all(exp.Column)} - own
    outer = max((rows_of[n] for n in read if n in rows_of), default=max(rows_of.values()))
    inner = rows_of[j.scans[0].name]
    tie = exp.EQ(this=j.value.copy(), expression=j.lhs.copy())
    found = [evaluated(t, resolved, condition=True) for t in (tie, correlated)]
    return _join(outer * inner, found, JOIN_STEPS)


def _arguments(value: exp.Expression) -> list[exp.Expression]:
    """The row expressions a per-person value's aggregates read."""
    out: list[exp.Expression] = []
    for agg in value.find_all(exp.AggFunc):
        args = agg.this.expressions if isinstance(agg.this, exp.Distinct) else [agg.this]
        out += [a for a in args if not isinstance(a, exp.Star)]
    return out


def _join(rows: int, found: list[Evaluation], fixed: int) -> Join:
    return Join(rows, sum(e.unit for e in found) + fixed, sum(e.row for e in found) + fixed)


def within(work: Work, limit: int, row_limit: int, unit: str | None) -> None:
    """Refuse, free, a query whose bound is above the policy's ``max_unit_work``, or one
    row of which could cost more than ``max_row_work`` (``row_limit``): DuckDB checks
    for an interrupt only between vectors, so a vector of such rows could hold the
    engine, and a reply, past the time limit by more than the padding hides."""
    if work.row > row_limit:
        raise Refused(
            f"one row of this query could cost up to {work.row:,} steps, above the "
            f"dataset's max_row_work of {row_limit:,} (a vector of {VECTOR_ROWS:,} such rows "
            "must stay well inside the padding quantum): match shorter patterns, fold "
            "(UPPER, LOWER, ILIKE) or concatenate fewer or shorter texts, or ask the owner "
            "for a shorter max_length on the text columns you read"
        )
    if work.total <= limit:
        return
    who = f"one {unit}" if unit else "one row"
    raise Refused(
        f"{who} could add up to {work.total:,} steps of work to this query ({work.rows:,} "
        f"joined rows), above the policy's max_unit_work of {limit:,}: join fewer or "
        "smaller public tables, on a column (p.key = …) rather than a condition, read "
        "private tables fewer times, or avoid arithmetic that could overflow on some "
        "row (it runs under TRY, the costliest)"
    )


def evaluated(tree: exp.Expression, resolved: Resolved, condition: bool = False) -> Evaluation:
    """What one row's evaluation of ``tree`` may cost as the SQL evaluates it: its own
    steps (``steps_of``), or under ``TRY`` (``totality.total``: when a node might raise,
    or a condition is not boolean) a vector's worth on the slow path."""
    own = steps_of(tree, resolved)
    tried = may_raise(tree, resolved)
    if condition and not tried:
        found = kind(tree, resolved)
        tried = found is None or found.family not in BOOLEAN_LIKE
    if not tried:
        return Evaluation(own, own)
    return Evaluation(VECTOR_ROWS * (own + TRY_ROW_STEPS), 2 * own + TRY_ROW_STEPS)


def steps_of(tree: exp.Expression, resolved: Resolved) -> int:
    """The steps one evaluation of ``tree`` on one row costs at its worst: the sum of
    its nodes' prices (``prices.py``). A text any node may make longer than the
    dataset's ``max_text_length`` is refused (free) here, so no row ever carries one."""
    limit = resolved.dataset.max_text_length
    total = 0
    for node in tree.find_all(exp.Expression):  # every node, as walk() (typed Expr)
        if isinstance(node, exp.Identifier | exp.DataType):
            continue  # names and types: no work
        if isinstance(node, DERIVED_TEXTS) and text_length(node, resolved) > limit:
            raise Refused(
                f"{_short(display(node))} could make a text of up to "
                f"{text_length(node, resolved):,} characters, longer than the dataset's "
                f"max_text_length of {limit:,}: concatenate fewer or shorter texts"
            )
        total += price(node, resolved)
    return total


def _short(sql: str) -> str:
    """The user's expression, cut for a message (a long literal need not be quoted whole)."""
    return sql if len(sql) <= 80 else sql[:60] + " … " + sql[-15:]


# Nodes whose text is made on the row, not read from the data or the query: the only
# places a text longer than every column's ``max_length`` could come from.
DERIVED_TEXTS = (*CONCATENATION, exp.Upper, exp.Lower)


def _fan_out(scans: tuple[Scan, ...], terms: list[exp.Expression], r: Resolved) -> int:
    """The product over the public scans of ``scans`` of the rows one row can match."""
    product = 1
    for scan in scans:
        if not scan.table.public:
            continue
        conditions = terms + (conjuncts(scan.on) if scan.on is not None else [])
        product *= _matches(scan, conditions, r)
    return product


def _matches(scan: Scan, conditions: list[exp.Expression], r: Resolved) -> int:
    """The most rows of public ``scan`` one row of the rest of the join can match."""
    rows = scan.table.rows
    if rows is None:
        raise Refused(f"the public table {scan.table.name!r} has no known size")
    best = rows
    for cond in conditions:
        if not isinstance(cond, exp.EQ):
            continue
        for mine, other in ((cond.this, cond.expression), (cond.expression, cond.this)):
            col = r.column(mine) if isinstance(mine, exp.Column) else None
            if col is None or mine.table != scan.name or col.repeats is None:
                continue
            if any(c.table == scan.name for c in other.find_all(exp.Column)):
                continue
            if _same_type(col.type, other, r):
                best = min(best, col.repeats)
    return max(best, 1)


def _same_type(kind: str, other: exp.Expression, r: Resolved) -> bool:
    """Whether ``other`` compares with a column of type ``kind`` without a cast, so
    that only rows holding one stored value can equal it."""
    col = r.column(other)
    if col is not None:
        return col.type == kind
    if isinstance(other, exp.Literal):
        return (kind == "str") == other.is_string and (kind != "int" or other.is_int)
    return False
