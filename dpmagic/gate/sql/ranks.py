"""Per-unit contribution bounding: one truncation at load, one filter per query.

Bounding a unit's rows by a window sort in every query (``row_number()``
over the unit and the group key, as SmartNoise SQL's reservoir sampling
does) costs a sort of the whole table per query: 10-50× the query itself.
Here the sort happens once, when the gate loads a dataset:

1. **At load** (``engines/ranking.prepare_sql``, below these passes: every
   engine prepares its tables so), each row of a private table gets its rank
   ``__dpmagic_rank`` (1, 2, …) within its unit, in an order drawn by a keyed
   hash, under a secret seed, of the row's content and its copy number among
   identical rows of the unit; ties are broken by the content itself, so the
   order is total. Rows whose unit is NULL (or not of its declared type)
   belong to no one we can bound and are dropped.
2. **Per query** (``room_reads``), only rows with rank ``<= rows_per_unit``
   are read: a plain filter on an integer column, which DuckDB evaluates
   during the scan. That is before the user's ``WHERE``, so a query whose
   filters may drop some of a unit's rows (``drops_rows``) and whose ``K``
   would leave out any row it reads is bounded by the window instead, after
   its filters, among the rows that pass. A query bounded otherwise
   (after its joins, by the window) still reads at most ``load_cap`` joined
   rows (``max_partitions × max_rows_per_partition``) of a unit, through the
   same rooms as below (``join_cap``), which bounds the work one unit can
   cause (``sql/work.py``). Rows ranked beyond every query's reach are kept
   all the same, so that the bounding report (``rewrite.left_out``) can count
   what the bounds leave out.

Privacy argument. Fix the seed. A unit's ranks are a function of that unit's
own rows and the seed only: the partition of the window is the unit, and the
order is a total order on row contents (the hash, then the row). Adding,
removing or replacing one unit therefore leaves every other unit's ranked
rows unchanged, and the changed unit keeps at most ``K = rows_per_unit`` rows
in the query, however the ``WHERE`` and the ``GROUP BY`` then treat them. So
the table a query sees is a 1-stable transformation of the data (in units),
for every seed; the seed is drawn independently of the data. What one unit
with at most ``K`` rows, spread over the released partitions in any way, may
then move (that of one group of ``K`` rows), and what the window and row level
allow, is ``dp/enforcement``'s rule, which each bounding's ``contribution``
calls: here is only how the SQL enforces the bound
(``tests/unit/test_sensitivity.py`` checks the SQL by brute force, seed by
seed; ``tests/unit/dp/test_production.py`` the rule).

Joins of private tables only. A join may multiply a unit's rows (a unit's
``a`` rows joined to its ``b`` rows give up to ``a·b``), so each kept row of a
private table ``T`` also carries, for every private table ``U`` of the dataset,
``__dpmagic_rows_U``: how many rows its unit has in ``U`` (0 if none, at most
``load_cap``),
again a function of that unit's own rows; each scan of a join keeps only the
ranks its unit's earlier scans leave room for (``room_reads``), so that a unit
keeps at most ``K`` joined rows. The rule and its proof are
``dpmagic/gate/dp/join_bounding.py``; its brute-force test is beside it in
``tests/unit/dp/``. Under an accountant that may add Gaussian noise, a join takes
this path only where ``K`` is ``max_rows_per_partition``: elsewhere the L2
sensitivity of ``K`` rows anywhere exceeds that of the window's rows in several
groups, and the window stays. These bounds are filters on each scan: no sort, no
aggregate per unit, no extra column carried through the join (a 1M-row join:
17 ms, against 225 ms with the window sorts). A public table in the join could
multiply a unit's rows by its own duplicates, and a count of distinct units could
spend a unit's ``K`` rows in ``K`` partitions, one unit each: those queries keep
the per-query window bounding of ``rewrite.bound_contributions`` after their
joins, on tables already truncated at load, which only ever removes rows of the
unit they belong to. Their private scans keep the same rooms, with the load cap
for ``K`` (``join_cap``): the window could keep no more of a unit than that, and
without them a unit's rows would multiply through a self-join before the window
bounds them (a 10-scan self-join of one patient's 8 visits: 8^10 rows, 20 s,
against 0.08 s without that patient), a timing channel about one unit at any ε.
A semi-join's private scans are read the same way.

``K`` is ``max_rows_per_partition`` without a ``GROUP BY``, and
``min(max_partitions, partitions) × max_rows_per_partition`` with one: the
same L1 sensitivity as bounding groups and rows per group separately, at
the price of a fixed row order (a unit's first ``K`` rows, not its first
``K`` rows that pass the ``WHERE``). The cost stays a function of the query
and the policy: ``K`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.dp import enforcement
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.engines.ranking import RANK, ROWS, first_ranks, load_cap
from dpmagic.gate.policy import AccountantKind, Dataset
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.trees import conjuncts
from dpmagic.gate.sql.unit_keys import keys_fixed_by_unit
from dpmagic.gate.sql.value_range import ValueRange

PRODUCT = "__dpmagic_p"  # + j: a unit's joined rows after a join's first j + 1 scans


def rows_per_unit(dataset: Dataset, grouped: bool, partitions: int) -> int:
    if not grouped:
        return dataset.max_rows_per_partition
    return min(dataset.max_partitions, partitions) * dataset.max_rows_per_partition


@dataclass(frozen=True)
class RowLevel:
    """No privacy unit: each row is its own unit, one row in one partition."""

    def contribution(self, partitions: int) -> Contribution:
        return enforcement.row_level(partitions)


@dataclass(frozen=True)
class Ranked:
    """Bounded by the load-time ranks alone: each private scan keeps a unit's first
    ``rows`` ranks, a join's later scans only what its earlier ones leave room for
    (``room_reads``); ``rows`` rows in any partitions."""

    rows: int

    def contribution(self, partitions: int) -> Contribution:
        return enforcement.ranked(self.rows, partitions)


@dataclass(frozen=True)
class Window:
    """Bounded per query after the joins (``rewrite.bound_contributions``): at most
    ``rows`` rows per unit and partition, in at most ``groups`` partitions; the joins
    before it keep at most ``joined`` rows of a unit (``join_cap``)."""

    groups: int
    rows: int
    joined: int

    def contribution(self, partitions: int) -> Contribution:
        return enforcement.window(self.groups, self.rows, partitions)


Bounding = RowLevel | Ranked | Window


def join_cap(bounding: Bounding) -> int:
    """The most rows one unit keeps in a join of private scans (``room_reads``): the
    plan's ``K`` under the ranks, else the load cap (or less, by the tables' own
    bounds: ``table_cap``), which the window after the join then bounds per
    partition. Never a product of scans: one unit's rows multiplied by a self-join
    would otherwise be its work (``sql/work.py``)."""
    if isinstance(bounding, RowLevel):
        return 1  # each row is its own unit, and a join is refused without one
    return bounding.rows if isinstance(bounding, Ranked) else bounding.joined


def bounding(
    dataset: Dataset,
    resolved: Resolved,
    keys: Sequence[exp.Expression],
    partitions: int,
    kinds: set[MeasureKind],
    private_keys: bool,
) -> Bounding:
    """How this query bounds each unit's contribution (see above), decided once: the
    plan's sensitivity and the generated SQL both read it. ``keys``: the group keys;
    ``private_keys``: keys chosen by partition selection, whose count of keys a unit
    reaches only the window bounds. The window keeps one group a unit where every
    key is one the unit's rows all share (``unit_keys``: no row is lost by it)."""
    if dataset.privacy_unit is None:
        return RowLevel()
    tables = table_cap(resolved)
    joined = load_cap(dataset) if tables is None else min(load_cap(dataset), tables)
    grouped = bool(keys)
    groups = dataset.max_partitions if grouped else 1
    if grouped and keys_fixed_by_unit(resolved, keys):
        groups = 1
    window = Window(min(groups, joined), min(dataset.max_rows_per_partition, joined), joined)
    if private_keys or MeasureKind.COUNT_UNIT in kinds:
        return window
    if any(s.table.public for s in resolved.scans):
        return window
    if any(s.per_unit is not None and (s.table.max_rows or 0) > 1 for s in resolved.scans):
        # A per-person subquery of several rows a unit (one per order) is made in the
        # query, not ranked at load: only the window bounds its rows in the query around.
        return window
    k = rows_per_unit(dataset, grouped, partitions)
    k = k if tables is None else min(k, tables)
    if k < joined and drops_rows(resolved):
        # The ranks keep a unit's first K rows before the query's filters, which may
        # then drop them while rows that pass stay unread: bound after, among the rows
        # the query keeps (the window), whenever K leaves any of the read rows out.
        return window
    if (
        len(resolved.scans) > 1
        and dataset.accountant != AccountantKind.PURE
        and k > dataset.max_rows_per_partition
    ):
        # Gaussian noise scales with the L2 sensitivity, which is larger for K rows
        # anywhere than for the window's rows per group in each of several groups:
        # such a join keeps the window rather than get noisier than it was.
        return window
    return Ranked(k)


def drops_rows(resolved: Resolved) -> bool:
    """Whether the query's row filters may drop some of a unit's rows and keep others:
    a ``WHERE`` term or a join condition other than the equality of two scans' units
    (which keeps all of a unit's rows or none), a semi-join."""
    where = resolved.tree.args.get("where")
    terms = conjuncts(where.this) if where is not None else []
    terms += [t for s in resolved.scans if s.on is not None for t in conjuncts(s.on)]
    return bool(resolved.semijoins) or not all(_joins_units(t, resolved) for t in terms)


def _joins_units(term: exp.Expression, resolved: Resolved) -> bool:
    """``a.unit = b.unit`` for two scans of private tables."""
    if not isinstance(term, exp.EQ):
        return False
    for side in (term.this, term.expression):
        scan = resolved.scan(side.table) if isinstance(side, exp.Column) else None
        if scan is None or scan.table.unit is None or side.name != scan.table.unit:
            return False
    return True


def table_cap(resolved: Resolved) -> int | None:
    """The most rows one unit can have in the query's join by its tables' own bounds
    (``max_rows_per_unit``, the owner's fact: a table of one row per person has 1): the
    product over its private scans, or ``None`` if one of them declares none.

    Why it may tighten ``K``: ``room_reads`` keeps at most ``K`` joined rows of a unit
    whatever the data, so with ``K`` at most this product the bound holds even where
    a table breaks its declaration (its rows beyond are left out, as any bound does),
    and a unit's contribution, hence the sensitivity, is that of ``K`` rows."""
    product = 1
    for scan in resolved.scans:
        if scan.table.public:
            continue
        if scan.table.max_rows is None:
            return None
        product *= scan.table.max_rows
    return product


@dataclass(frozen=True)
class RoomRead:
    """How one private scan of a join reads its table: ``source`` (the table, or for a
    later scan a chain of subqueries over it that carries its unit's product of the
    earlier scans' factors, one column a scan) and ``bound``, which keeps the ranks
    within its room."""

    source: exp.Expression
    bound: exp.Expression


def room_reads(
    tables: list[str],
    cap: int,
    first: Callable[[str, int], exp.Expression] = first_ranks,
    keyed: list[int | None] | None = None,
) -> list[RoomRead]:
    """What each private scan of a join (over ``tables``, in join order) reads so that a
    unit keeps at most ``cap`` joined rows, whatever the join order the engine picks:
    the first ``cap`` ranks of a single table, less room for a join's later scans.
    This is ``dp.join_bounding.rooms`` written in SQL over the counts stored at load.
    The first scan's room is the constant ``cap``, read as ``first`` reads a table's
    first ranks (the engine's dialect decides how); the later scans' rooms depend on
    each row, and are read by the rank.

    Scan ``i`` needs ``p_(i-1)``, which depends on ``p_(i-2)`` twice (in the room and
    in the product): written as one expression it doubles with each scan (a 30-scan
    join would be gigabytes of SQL), so each ``p_j`` is a column of its own,
    computed by one subquery over the previous one, and the SQL grows with the square
    of the scans. Every filter reads only the scan's own row (every private row
    carries its unit's counts in every private table), so it holds before any join.

    A keyed scan (``keyed[i]`` its room, ``sql/keyed.py``) reads its first ``keyed[i]``
    ranks (at most ``cap``) and is no factor of the later scans' rooms
    (``dp.join_bounding``'s keyed rule)."""
    fixed = keyed or [None] * len(tables)
    reads = []
    for i, table in enumerate(tables):
        source: exp.Expression = exp.table_(table, quoted=True)
        product: exp.Expression | None = None
        keyed_room = fixed[i]
        if keyed_room is not None:
            reads.append(RoomRead(source, first(table, min(keyed_room, cap))))
            continue
        for j, earlier in enumerate(tables[:i]):
            if fixed[j] is not None:
                continue
            room = _room(cap, product)
            count = exp.column(ROWS + earlier, quoted=True)
            least = exp.Least(this=count, expressions=[room], ignore_nulls=True)
            factor = exp.Greatest(this=exp.Literal.number(1), expressions=[least],
                                  ignore_nulls=True)  # fmt: skip
            value = factor if product is None else exp.Mul(this=product, expression=factor)
            step = exp.select(exp.Star(), exp.alias_(value, PRODUCT + str(j), quoted=True))
            source = exp.Subquery(
                this=step.from_(source),
                alias=exp.TableAlias(this=exp.to_identifier(f"__dpmagic_r{j}", quoted=True)),
            )
            product = exp.column(PRODUCT + str(j), quoted=True)
        if product is None:
            bound = first(table, cap)
        else:
            bound = exp.LTE(this=exp.column(RANK, quoted=True), expression=_room(cap, product))
        reads.append(RoomRead(source, bound))
    return reads


def _room(cap: int, product: exp.Expression | None) -> exp.Expression:
    k = exp.Literal.number(cap)
    return k if product is None else exp.Paren(this=exp.IntDiv(this=k, expression=product.copy()))


def clamped(value: exp.Expression, bounds: ValueRange) -> exp.Expression:
    """``engines/ranking.clamp`` as a tree, for the SQL of each query."""
    lo, hi = literal(bounds.lo, bounds.integral), literal(bounds.hi, bounds.integral)
    return exp.Paren(
        this=exp.Case(
            ifs=[
                exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.Null()),
                exp.If(this=exp.LT(this=value.copy(), expression=lo), true=lo.copy()),
                exp.If(this=exp.GT(this=value.copy(), expression=hi), true=hi.copy()),
            ],
            default=value.copy(),
        )
    )


def literal(value: float, integral: bool) -> exp.Expression:
    """``engines/ranking.number`` as a tree: an integer, or a double written exactly."""
    if integral:
        return exp.Literal.number(int(value))
    return exp.cast(exp.Literal.string(repr(float(value))), exp.DataType.Type.DOUBLE)
