"""Hypothesis strategies for the SQL the gate accepts, built from the checker's allow-list.

The grammar is keyed by the checker's own tables (``check.SCALAR_NODES``,
``ROW_ONLY_NODES``, ``TEXT_FUNCTIONS``, ``CONCATENATION``, ``DATE_PARTS``,
``EXTRACT_UNITS``, ``CAST_TYPES``, the catalogue's node types, ``COMPARISONS``,
``ARITHMETIC``): every node type the checker lets through has a builder here,
and a node type the checker gains without a builder is an error at import
(``test_sql_grammar.py`` also checks that each one is actually generated).
So the fuzzer searches the whole language the gate answers, not a list of
shapes someone thought of.

Expressions are typed by the checker's families (number, text, date, and
conditions, which DuckDB treats as numbers where the checker does): the
generator mostly writes queries the checker accepts, so the examples reach
DuckDB instead of stopping at a refusal. Literals favour the values where
engines break: the ends of TINYINT … HUGEINT, ±2^62, 2^63, float extremes and
many-digit decimals, huge and negative positions, dates at the ends of their
range, text that casts to ``nan``/``inf`` or to an integer at a type's edge,
empty and long strings, NULL.

A query is a row expression placed where the gate evaluates rows: in
``WHERE``, in an aggregate's argument (or ``FILTER``), inside ``CASE WHEN
<one unit's attributes>`` (which turns any failure on that unit's rows into an
oracle for its presence) and as a ``GROUP BY`` key; and a release-level
expression over aggregates (``HAVING``, ``ORDER BY``, arithmetic), which may
only depend on noisy values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st
from sqlglot import exp, parse_one

from dpmagic.gate.sql import check
from dpmagic.gate.sql.aggregates.registry import CATALOGUE
from dpmagic.gate.sql.parse import DIALECT

NUM, TEXT, DATE, BOOL = "number", "text", "date", "bool"
TEXTUAL = "textual"  # text that text functions accept (no CASE, COALESCE or NULL)
FAMILIES = (NUM, TEXT, DATE, BOOL)
Strategy = st.SearchStrategy[exp.Expression]

# -- literals where engines break ----------------------------------------------------

_TYPE_EDGES = [2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**63, 2**64, 2**127, 2**128]
EXTREME_INTS = sorted(
    {0, 1, 2, 3, 7, 10, 100, 120, 1000, 10**6, 2**53, 2**53 + 1, 2**62, 2**62 + 1}
    | {e + d for e in _TYPE_EDGES for d in (-1, 0, 1)}
)
EXTREME_DECIMALS = [
    "0.5", "1.5", "0.1", "1e308", "1.7976931348623157e308", "4.9e-324", "1e-400", "1e400",
    "9223372036854775807.5", "170141183460469231731687303715884105727.0",
    "123456789012345678901234567890.123456789012345678901234567890",
    "0.000000000000000000000000000000000000000000000001",
]  # fmt: skip
EXTREME_TEXTS = [
    "", "a", "A", " ", "127", "128", "-129", "255", "32767", "32768", "2147483648",
    "4294967296", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
    "170141183460469231731687303715884105728", "1e308", "1e309", "-1e309", "nan", "NaN",
    "inf", "-inf", "Infinity", " 42 ", "0x7f", "1_000", "true", "false", "t", "0001-01-01",
    "9999-12-31", "2024-02-30", "%", "_", "'", "é" * 40, "z" * 3000,
]  # fmt: skip
EXTREME_DATES = [
    "0001-01-01", "0001-12-31", "1969-12-31", "1970-01-01", "1999-12-31", "2000-01-01",
    "2000-02-29", "2030-12-31", "2031-01-01", "9999-01-01", "9999-12-31",
]  # fmt: skip
QUANTILES = ["0", "0.5", "1", "0.25", "0.999999999999"]
LIKE_PATTERNS = ["%", "_", "", "%7%", "1_7", "z%", "%z", "\\%", "[a]%", "%" * 50]


def int_literal(value: int) -> exp.Expression:
    """An integer as DuckDB reads it: a negative one is ``-`` applied to a literal."""
    lit = exp.Literal.number(str(abs(value)))
    return exp.Neg(this=lit) if value < 0 else lit


def date_literal(text: str) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("DATE"))


# The edges of the narrow integer types, which the checker's 64-bit bounds allow: drawn
# most often, since an operand there is what overflows TINYINT … INTEGER arithmetic.
NARROW_EDGES = [1, 2, 100, 127, 128, 255, 256, 32767, 32768, 65535, 2**31 - 1, 2**31, 2**32]
NARROW_TYPES = (exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT)
ints = st.one_of(
    st.sampled_from(NARROW_EDGES),
    st.sampled_from(EXTREME_INTS),
    st.sampled_from(NARROW_EDGES).map(lambda v: -v),
    st.sampled_from(EXTREME_INTS).map(lambda v: -v),
    st.integers(-(2**64), 2**64),
)
positions = st.one_of(
    st.sampled_from(EXTREME_INTS),
    st.sampled_from([-1, -2, -(2**31), -(2**62), -(2**63)]),
    st.integers(-3, 2**63 + 1),
)
number_literals = st.one_of(
    ints.map(int_literal),
    st.sampled_from(EXTREME_DECIMALS).map(exp.Literal.number),
    st.sampled_from(EXTREME_DECIMALS).map(lambda d: exp.Neg(this=exp.Literal.number(d))),
)
text_literals = st.one_of(
    st.sampled_from(EXTREME_TEXTS), st.text(max_size=8).filter(lambda s: "\x00" not in s)
).map(exp.Literal.string)
INTERVAL_UNITS = ["YEAR", "QUARTER", "MONTH", "WEEK", "DAY", "DAYS", "HOUR"]


def moved(base: exp.Expression, unit: str, count: int, add: bool) -> exp.Expression:
    """``base ± INTERVAL 'count' unit``, as analysts write date windows (the gate's
    ``normalize/intervals.py`` folds it; out of the calendar, it stays for the checks)."""
    interval = exp.Interval(this=exp.Literal.string(str(count)), unit=exp.var(unit))
    return (exp.Add if add else exp.Sub)(this=base, expression=interval)


plain_dates = st.sampled_from(EXTREME_DATES).map(date_literal)
date_literals = st.one_of(
    plain_dates,
    st.builds(
        moved, plain_dates, st.sampled_from(INTERVAL_UNITS), st.integers(-400, 400), st.booleans()
    ),
)


# -- the schema a grammar writes for ----------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """The columns a query may read, by family, as qualified ``table.column`` names, and
    conditions that single out one unit (``t.pid = 7``, ``t.age = 39 AND …``)."""

    columns: dict[str, tuple[str, ...]]  # family -> qualified columns
    targets: tuple[str, ...]  # SQL conditions true exactly on the target unit's rows

    def column(self, family: str) -> Strategy | None:
        names = self.columns.get(family, ())
        if not names:
            return None
        return st.sampled_from(names).map(lambda n: exp.column(*reversed(n.split("."))))

    def target(self) -> Strategy:
        return st.sampled_from(self.targets).map(lambda s: parse_one(s, dialect=DIALECT))


# -- one builder per allowed node type ------------------------------------------------
#
# A builder takes (grammar, family, depth) and returns a strategy for a node of its
# type whose value is of ``family``, or None when the node cannot produce that family.
# Leaves (literals, NULL, columns) ignore depth; the others draw children at depth − 1.

Builder = Callable[["Grammar", str, int], Strategy | None]


def _literal(g: Grammar, family: str, depth: int) -> Strategy | None:
    return {NUM: number_literals, TEXT: text_literals, DATE: date_literals}.get(family)


def _boolean(g: Grammar, family: str, depth: int) -> Strategy | None:
    return st.booleans().map(lambda b: exp.Boolean(this=b)) if family == BOOL else None


def _null(g: Grammar, family: str, depth: int) -> Strategy | None:
    return st.just(exp.Null())


def _column(g: Grammar, family: str, depth: int) -> Strategy | None:
    return g.schema.column(family)


def _paren(g: Grammar, family: str, depth: int) -> Strategy | None:
    return g.expr(family, depth - 1).map(lambda e: exp.Paren(this=e))


def _neg(g: Grammar, family: str, depth: int) -> Strategy | None:
    return g.expr(NUM, depth - 1).map(lambda e: exp.Neg(this=e)) if family == NUM else None


def _binary(node: type[exp.Expression], operands: tuple[str, ...], result: str) -> Builder:
    """``a <op> b`` with both operands of one of ``operands``' families."""

    def build(g: Grammar, family: str, depth: int) -> Strategy | None:
        if family != result:
            return None
        pairs = [
            st.tuples(g.expr(f, depth - 1), g.expr(f, depth - 1)) for f in operands
        ]  # same family on both sides: the checker refuses mixed comparisons
        return st.one_of(pairs).map(lambda ab: node(this=ab[0], expression=ab[1]))

    return build


COMPARED = (NUM, TEXT, DATE)


def _or(g: Grammar, family: str, depth: int) -> Strategy | None:
    """``a OR b``, and as often ``(c AND a) OR (c AND b)``: a condition repeated in
    every branch, which the gate factors out (``normalize/or_factoring.py``)."""
    plain = _binary(exp.Or, (BOOL,), BOOL)(g, family, depth)
    if plain is None:
        return None
    parts = st.tuples(*(g.expr(BOOL, depth - 1) for _ in range(3)))
    shared = parts.map(
        lambda abc: exp.Or(
            this=exp.paren(exp.And(this=abc[2], expression=abc[0])),
            expression=exp.paren(exp.And(this=abc[2].copy(), expression=abc[1])),
        )
    )
    return st.one_of(plain, shared)


def _not(g: Grammar, family: str, depth: int) -> Strategy | None:
    return g.expr(BOOL, depth - 1).map(lambda e: exp.Not(this=e)) if family == BOOL else None


def _is(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != BOOL:
        return None
    return st.tuples(st.sampled_from(FAMILIES), st.booleans()).flatmap(
        lambda fb: g.expr(fb[0], depth - 1).map(
            lambda e: (
                exp.Is(this=e, expression=exp.Null())
                if fb[1]
                else exp.Not(this=exp.Is(this=e, expression=exp.Null()))
            )
        )
    )


def _in(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != BOOL:
        return None
    return st.sampled_from(COMPARED).flatmap(
        lambda f: st.tuples(
            g.expr(f, depth - 1), st.lists(g.expr(f, depth - 1), min_size=1, max_size=3)
        ).map(lambda t: exp.In(this=t[0], expressions=t[1]))
    )


def _between(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != BOOL:
        return None
    return st.sampled_from(COMPARED).flatmap(
        lambda f: st.tuples(*(g.expr(f, depth - 1) for _ in range(3))).map(
            lambda t: exp.Between(this=t[0], low=t[1], high=t[2])
        )
    )


def _case(g: Grammar, family: str, depth: int) -> Strategy | None:
    """``CASE WHEN c THEN a [WHEN …] [ELSE b] END``; the first condition is often the
    target unit's attributes, so a branch runs on that unit's rows alone."""
    condition = st.one_of(g.schema.target(), g.expr(BOOL, depth - 1))
    branch = st.tuples(condition, g.expr(family, depth - 1)).map(
        lambda cv: exp.If(this=cv[0], true=cv[1])
    )
    return st.tuples(
        st.lists(branch, min_size=1, max_size=2), st.none() | g.expr(family, depth - 1)
    ).map(lambda t: exp.Case(ifs=t[0], default=t[1]))


def _if(g: Grammar, family: str, depth: int) -> Strategy | None:
    condition = st.one_of(g.schema.target(), g.expr(BOOL, depth - 1))
    return st.tuples(condition, g.expr(family, depth - 1), g.expr(family, depth - 1)).map(
        lambda t: exp.If(this=t[0], true=t[1], false=t[2])
    )


def _variadic(node: type[exp.Expression], families: tuple[str, ...]) -> Builder:
    def build(g: Grammar, family: str, depth: int) -> Strategy | None:
        if family not in families:
            return None
        return st.lists(g.expr(family, depth - 1), min_size=2, max_size=3).map(
            lambda args: node(this=args[0], expressions=args[1:])
        )

    return build


def _nullif(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family not in COMPARED:
        return None
    return st.tuples(g.expr(family, depth - 1), g.expr(family, depth - 1)).map(
        lambda t: exp.Nullif(this=t[0], expression=t[1])
    )


def _unary(node: type[exp.Expression]) -> Builder:
    def build(g: Grammar, family: str, depth: int) -> Strategy | None:
        return g.expr(NUM, depth - 1).map(lambda e: node(this=e)) if family == NUM else None

    return build


def _round(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != NUM:
        return None
    digits = st.none() | positions.map(int_literal)
    return st.tuples(g.expr(NUM, depth - 1), digits).map(
        lambda t: exp.Round(this=t[0], decimals=t[1])
    )


def _try_cast(g: Grammar, family: str, depth: int) -> Strategy | None:
    """``TRY_CAST(x AS T)`` for every allowed target T, from numbers, conditions and text
    (text that reads as ``nan``, ``inf`` or an integer at a type's edge)."""
    if family == NUM:
        targets = sorted(t.value for t in check.CAST_TYPES if t != exp.DataType.Type.BOOLEAN)
        targets += [t.value for t in NARROW_TYPES]  # twice as often: their arithmetic overflows
    elif family == BOOL:
        targets = [exp.DataType.Type.BOOLEAN.value]
    else:
        return None
    source = st.sampled_from((NUM, NUM, TEXT, BOOL)).flatmap(lambda f: g.expr(f, depth - 1))
    return st.tuples(source, st.sampled_from(targets)).map(
        lambda t: exp.TryCast(this=t[0], to=exp.DataType.build(t[1]))
    )


def _data_type(g: Grammar, family: str, depth: int) -> Strategy | None:
    return _try_cast(g, family, depth)  # a DataType only ever stands in a TRY_CAST


def _like(node: type[exp.Expression]) -> Builder:
    def build(g: Grammar, family: str, depth: int) -> Strategy | None:
        if family != BOOL:
            return None
        pattern = st.sampled_from(LIKE_PATTERNS).map(exp.Literal.string)
        return st.tuples(g.expr(TEXT, depth - 1), pattern).map(
            lambda t: node(this=t[0], expression=t[1])
        )

    return build


def _dated(g: Grammar) -> Strategy:
    """What a date part reads: the checker wants a date column or a date literal."""
    column = g.schema.column(DATE)
    return date_literals if column is None else st.one_of(column, date_literals)


def _extract(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != NUM:
        return None
    return st.tuples(st.sampled_from(sorted(check.EXTRACT_UNITS)), _dated(g)).map(
        lambda t: exp.Extract(this=exp.var(t[0]), expression=t[1])
    )


def _date_part(node: type[exp.Expression]) -> Builder:
    def build(g: Grammar, family: str, depth: int) -> Strategy | None:
        return _dated(g).map(lambda e: node(this=e)) if family == NUM else None

    return build


def _text_unary(node: type[exp.Expression]) -> Builder:
    def build(g: Grammar, family: str, depth: int) -> Strategy | None:
        return g.textual(depth - 1).map(lambda e: node(this=e)) if family == TEXT else None

    return build


def _trim(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != TEXT:
        return None
    chars = st.none() | st.sampled_from(["", " ", "z", "0123456789"]).map(exp.Literal.string)
    return st.tuples(g.textual(depth - 1), chars).map(
        lambda t: exp.Trim(this=t[0], expression=t[1])
    )


def _substring(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != TEXT:
        return None
    length = st.none() | positions.map(int_literal)
    return st.tuples(g.textual(depth - 1), positions.map(int_literal), length).map(
        lambda t: exp.Substring(this=t[0], start=t[1], length=t[2])
    )


def _left_right(node: type[exp.Expression]) -> Builder:
    def build(g: Grammar, family: str, depth: int) -> Strategy | None:
        if family != TEXT:
            return None
        return st.tuples(g.textual(depth - 1), positions.map(int_literal)).map(
            lambda t: node(this=t[0], expression=t[1])
        )

    return build


def _length(g: Grammar, family: str, depth: int) -> Strategy | None:
    return g.textual(depth - 1).map(lambda e: exp.Length(this=e)) if family == NUM else None


def _dpipe(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != TEXT:
        return None
    operand = st.sampled_from(FAMILIES).flatmap(lambda f: g.expr(f, depth - 1))
    return st.tuples(operand, operand).map(lambda t: exp.DPipe(this=t[0], expression=t[1]))


def _concat(g: Grammar, family: str, depth: int) -> Strategy | None:
    if family != TEXT:
        return None
    operand = st.sampled_from(FAMILIES).flatmap(lambda f: g.expr(f, depth - 1))
    return st.lists(operand, min_size=1, max_size=3).map(
        lambda a: exp.Concat(expressions=a, safe=True, coalesce=True)  # CONCAT(…), not ||
    )


def _extract_var(g: Grammar, family: str, depth: int) -> Strategy | None:
    return _extract(g, family, depth)  # a Var only ever names an EXTRACT unit


ARITH = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod)
BUILDERS: dict[type[exp.Expression], Builder] = {
    exp.Literal: _literal, exp.Boolean: _boolean, exp.Null: _null, exp.Column: _column,
    exp.Paren: _paren, exp.Neg: _neg,
    **{op: _binary(op, (NUM,), NUM) for op in ARITH},
    **{op: _binary(op, COMPARED, BOOL) for op in check.COMPARISONS
       if op not in (exp.In, exp.Between)},
    exp.And: _binary(exp.And, (BOOL,), BOOL), exp.Or: _or,
    exp.Not: _not, exp.Is: _is, exp.In: _in, exp.Between: _between,
    exp.Case: _case, exp.If: _if,
    exp.Coalesce: _variadic(exp.Coalesce, FAMILIES),
    exp.Greatest: _variadic(exp.Greatest, COMPARED), exp.Least: _variadic(exp.Least, COMPARED),
    exp.Nullif: _nullif,
    exp.Abs: _unary(exp.Abs), exp.Floor: _unary(exp.Floor), exp.Ceil: _unary(exp.Ceil),
    exp.Sqrt: _unary(exp.Sqrt), exp.Round: _round,
    exp.TryCast: _try_cast, exp.DataType: _data_type,
    exp.Like: _like(exp.Like), exp.ILike: _like(exp.ILike),
    exp.Extract: _extract, exp.Var: _extract_var,
    **{part: _date_part(part) for part in check.DATE_PARTS},
    exp.Upper: _text_unary(exp.Upper), exp.Lower: _text_unary(exp.Lower), exp.Trim: _trim,
    exp.Substring: _substring, exp.Left: _left_right(exp.Left),
    exp.Right: _left_right(exp.Right), exp.Length: _length,
    exp.DPipe: _dpipe, exp.Concat: _concat,
}  # fmt: skip
LEAVES = (exp.Column, exp.Literal, exp.Boolean, exp.Null)
# Where engines break: integer arithmetic in narrow types, casts, positions and lengths,
# branches on one unit. These are drawn this many times as often as the other nodes.
WEIGHTS: dict[type[exp.Expression], int] = {
    exp.Add: 3, exp.Mul: 3, exp.Sub: 2, exp.IntDiv: 2, exp.Mod: 2, exp.Neg: 2,
    exp.TryCast: 6, exp.Case: 3, exp.Substring: 3, exp.Left: 2, exp.Right: 2, exp.Length: 3,
    exp.Column: 2,
}  # fmt: skip

ROW_NODES = check.SCALAR_NODES + check.ROW_ONLY_NODES
_missing = [n.__name__ for n in ROW_NODES if n not in BUILDERS]
if _missing:  # the checker allows something the grammar cannot write
    raise ImportError(f"the SQL grammar has no builder for {', '.join(_missing)}")


# -- aggregates, by the catalogue's node types ------------------------------------------

# SQL for each aggregate node type; ``X`` stands for the argument, ``{q}`` for a level.
AGGREGATE_SQL: dict[type[exp.Expression] | str, tuple[str, ...]] = {
    exp.Count: ("COUNT(X)", "COUNT(DISTINCT X)"), exp.CountIf: ("COUNT_IF(X > 0)",),
    exp.Sum: ("SUM(X)",), exp.Avg: ("AVG(X)",),
    exp.Variance: ("VAR_SAMP(X)", "VARIANCE(X)"), exp.VariancePop: ("VAR_POP(X)",),
    exp.Stddev: ("STDDEV(X)",), exp.StddevSamp: ("STDDEV_SAMP(X)",),
    exp.StddevPop: ("STDDEV_POP(X)",), exp.Min: ("MIN(X)",), exp.Max: ("MAX(X)",),
    exp.Median: ("MEDIAN(X)",), exp.PercentileCont: ("QUANTILE_CONT(X, {q})",),
    exp.PercentileDisc: ("PERCENTILE_DISC({q}) WITHIN GROUP (ORDER BY X)", "QUANTILE_DISC(X, {q})"),
    exp.Quantile: ("QUANTILE(X, {q})",), "TRIMMED_MEAN": ("TRIMMED_MEAN(X, {q})",),
}  # fmt: skip
_missing = [getattr(n, "__name__", n) for n in CATALOGUE if n not in AGGREGATE_SQL]
if _missing:
    raise ImportError(f"the SQL grammar writes no {', '.join(_missing)}")
TEMPLATES = tuple(t for forms in AGGREGATE_SQL.values() for t in forms)


def aggregate(template: str, arg: exp.Expression, level: str = "0.5") -> exp.Expression:
    """``template`` with ``X`` replaced by the tree ``arg`` (no text splicing)."""
    tree = parse_one(template.replace("{q}", level), dialect=DIALECT)
    placeholder = next(c for c in tree.find_all(exp.Column) if c.name == "X")
    placeholder.replace(arg.copy())
    return tree


# -- the grammar ----------------------------------------------------------------------


class Grammar:
    """Typed row expressions over ``schema``, at most ``depth`` nodes deep."""

    def __init__(
        self, schema: Schema, depth: int = 2, enabled: frozenset[type] | None = None
    ) -> None:
        self.schema = schema
        self.depth = depth
        self.enabled = frozenset(ROW_NODES) if enabled is None else enabled | set(LEAVES)
        self._cache: dict[tuple[str, int], Strategy] = {}
        self._built: dict[tuple[str, int], Strategy] = {}

    def expr(self, family: str, depth: int | None = None) -> Strategy:
        depth = self.depth if depth is None else max(depth, 0)
        key = (family, depth)
        if key not in self._cache:
            self._cache[key] = _drawn(self, family, depth)
        return self._cache[key]

    def textual(self, depth: int) -> Strategy:
        """What a text function reads: the checker wants a text column, a string literal,
        or another text function or concatenation."""
        return self.expr(TEXTUAL, depth)

    def options(self, family: str, depth: int) -> Strategy:
        """The alternatives for one family and depth, built once when first drawn."""
        key = (family, depth)
        if key not in self._built:
            self._built[key] = self._build(family, depth)
        return self._built[key]

    def _narrow_leaf(self) -> Strategy | None:
        """``TRY_CAST(<column or literal> AS TINYINT|SMALLINT|INT)``: a leaf whose arithmetic
        DuckDB does in 8, 16 or 32 bits, while the checker's bounds are 64-bit."""
        if exp.TryCast not in self.enabled:
            return None
        column = self.schema.column(NUM)
        source = number_literals if column is None else st.one_of(column, number_literals)
        return st.tuples(source, st.sampled_from(NARROW_TYPES)).map(
            lambda t: exp.TryCast(this=t[0], to=exp.DataType.build(t[1].value))
        )

    def _build(self, family: str, depth: int) -> Strategy:
        if family == TEXTUAL:
            nodes = (exp.Column, exp.Literal)
            if depth > 0:
                nodes += tuple(n for n in check.TEXT_FUNCTIONS + check.CONCATENATION
                               if n is not exp.Length and n in self.enabled)  # fmt: skip
            built = [BUILDERS[n](self, TEXT, depth) for n in nodes]
            return st.one_of([b for b in built if b is not None])
        types = LEAVES if depth == 0 else ROW_NODES
        options = []
        for node in types:  # leaves first: Hypothesis shrinks towards the first options
            built = BUILDERS[node](self, family, depth) if node in self.enabled else None
            if built is not None:
                options += [built] * WEIGHTS.get(node, 1)
        narrow = self._narrow_leaf() if family == NUM else None
        if narrow is not None:
            options += [narrow] * 2
        # sampled_from, not one_of: one_of drops repeated alternatives, and so the weights.
        return st.sampled_from(options).flatmap(_itself)

    # Queries: a row expression placed where the gate evaluates rows.

    def where(self, table: str) -> st.SearchStrategy[str]:
        return self.expr(BOOL).map(lambda c: f"SELECT COUNT(*) FROM {table} WHERE {_sql(c)}")

    def aggregated(self, table: str) -> st.SearchStrategy[str]:
        """An aggregate of a numeric expression, sometimes with a FILTER or a WHERE."""

        def render(t: tuple) -> str:
            template, level, arg, cond, how = t
            agg = _sql(aggregate(template, arg, level))
            if cond is None:
                return f"SELECT {agg} FROM {table}"
            if how:
                return f"SELECT {agg} FILTER (WHERE {_sql(cond)}) FROM {table}"
            return f"SELECT {agg} FROM {table} WHERE {_sql(cond)}"

        return st.tuples(
            st.sampled_from(TEMPLATES),
            st.sampled_from(QUANTILES),
            self.expr(NUM),
            st.none() | self.expr(BOOL, 1),
            st.booleans(),
        ).map(render)

    def targeted(self, table: str) -> st.SearchStrategy[str]:
        """``CASE WHEN <target> THEN e ELSE e' END`` at the top of a WHERE or an aggregate."""

        def render(t: tuple) -> str:
            target, family, then, other, template = t
            case = exp.Case(ifs=[exp.If(this=target, true=then)], default=other)
            if family == BOOL:
                return f"SELECT COUNT(*) FROM {table} WHERE {_sql(case)}"
            return f"SELECT {_sql(aggregate(template, case))} FROM {table}"

        def branches(family: str) -> st.SearchStrategy[tuple]:
            return st.tuples(
                self.schema.target(),
                st.just(family),
                self.expr(family),
                st.none() | self.expr(family, 1),
                st.sampled_from(TEMPLATES),
            )

        return st.sampled_from((BOOL, NUM)).flatmap(branches).map(render)

    def grouped(self, table: str) -> st.SearchStrategy[str]:
        """A row expression as a GROUP BY key, by alias or by position."""

        def render(t: tuple) -> str:
            key, by_position = t
            group = "1" if by_position else "k"
            return f"SELECT {_sql(key)} AS k, COUNT(*) AS n FROM {table} GROUP BY {group}"

        key = st.sampled_from(FAMILIES).flatmap(lambda f: self.expr(f))
        return st.tuples(key, st.booleans()).map(render)

    def row_query(self, table: str) -> st.SearchStrategy[str]:
        """Any row-level placement over ``table`` (a FROM clause)."""
        targeted = self.targeted(table)  # half of them: any error there is an oracle
        return st.one_of(
            targeted, self.where(table), targeted, self.aggregated(table), targeted,
            self.grouped(table),
        )  # fmt: skip

    def staged(self, table: str) -> st.SearchStrategy[str]:
        """A row expression compared with a subquery used as a value: an aggregate over
        the same FROM (with its own FILTER or WHERE), released first (``sql/staged.py``)."""

        def render(t: tuple) -> str:
            left, op, stage = t
            return f"SELECT COUNT(*) FROM {table} WHERE {_sql(left)} {op} ({stage})"

        return st.tuples(
            self.expr(NUM), st.sampled_from(["<", ">", "<=", ">="]), self.aggregated(table)
        ).map(render)

    def staged_by_key(self, table: str = "t", key: str = "city") -> st.SearchStrategy[str]:
        """The query's rows compared with a subquery correlated on a public key
        (``t.city = o.city``), released per key first (``sql/staged.py``); or an
        aggregate over ``table`` grouped by the key in a CTE, released first, which the
        rest of the query only works on (``sql/released_tables.py``)."""

        def render(t: tuple) -> str:
            left, op, stage, rest, lit = t
            tie = f"t.{key} = o.{key}"
            if f"FROM {table} WHERE " in stage:
                inner = stage.replace(f"FROM {table} WHERE ", f"FROM {table} WHERE {tie} AND (")
                inner += ")"
            else:
                inner = f"{stage} WHERE {tie}"
            if rest is None:
                outer = _sql(left).replace(f"{table}.", "o.")
                return f"SELECT COUNT(*) FROM {table} AS o WHERE {outer} {op} ({inner})"
            head, tail = stage.split(f" FROM {table}", 1)
            cte = f"SELECT t.{key} AS k, {head[len('SELECT ') :]} AS v FROM {table}{tail}"
            body = {
                "max": "SELECT k, v FROM s WHERE v = (SELECT MAX(v) FROM s)",
                "above": f"SELECT COUNT(*) AS n FROM s WHERE v {op} {lit}",
                "order": "SELECT k FROM s ORDER BY v DESC LIMIT 1",
            }[rest]
            return f"WITH s AS ({cte} GROUP BY t.{key}) {body}"

        return st.tuples(
            self.expr(NUM),
            st.sampled_from(["<", ">", "<=", ">="]),
            self.aggregated(table),
            st.sampled_from([None, None, "max", "above", "order"]),
            st.integers(-5, 50),
        ).map(render)

    def per_person(self, table: str, unit: str = "t.pid") -> st.SearchStrategy[str]:
        """A subquery grouped by the unit (``unit``, a column of ``table``), its value an
        aggregate of the grammar's row expressions (bounded or not), its rows filtered,
        read by a query around it that filters or groups by the value."""

        def render(t: tuple) -> str:
            kind, arg, cond, around, lit = t
            column = _sql(arg)
            value = {
                "count": "COUNT(*)", "count_of": f"COUNT({column})", "sum": f"SUM({column})",
                "avg": f"AVG({column})", "max": f"MAX({column})",
                "clamped": f"LEAST(GREATEST(SUM({column}), 0), 10)",
            }[kind]  # fmt: skip
            where = f" WHERE {_sql(cond)}" if cond is not None else ""
            having = f" HAVING COUNT(*) > {lit % 3}" if lit % 2 else ""
            inner = f"SELECT {unit}, {value} AS v FROM {table}{where} GROUP BY {unit}{having}"
            if around:
                return f"SELECT p.v, COUNT(*) AS n FROM ({inner}) AS p GROUP BY p.v"
            return f"SELECT COUNT(*) AS n, SUM(p.v) AS s FROM ({inner}) AS p WHERE p.v > {lit}"

        return st.tuples(
            st.sampled_from(["count", "count_of", "sum", "avg", "max", "clamped"]),
            st.one_of(self.expr(NUM, 0), self.expr(NUM, 1)),
            st.none() | self.expr(BOOL, 1),
            st.booleans(),
            st.integers(-2, 12),
        ).map(render)

    def per_person_linked(self, table: str) -> st.SearchStrategy[str]:
        """``per_person`` over lines joined to their orders, by the orders' person."""
        return self.per_person(table, unit="o.pid")

    def semi_joined(self, table: str) -> st.SearchStrategy[str]:
        """A row condition inside a semi-join's subquery over the same table (its
        ``t.…`` names the subquery's own ``t``): ``IN``, ``[NOT] EXISTS``, or ``IN`` the
        persons with more than one row meeting it (``GROUP BY t.pid HAVING``). An
        ``EXISTS`` may also compare its rows with the query's row (``o``): a condition
        whose columns are drawn from either row (``_mixed``), beside the tie on the
        person."""

        def render(t: tuple) -> str:
            cond, exists, compared = t
            if exists is None:  # the persons whose rows meet it, more than once
                inner = (
                    f"SELECT t.pid FROM {table} WHERE {_sql(cond)} GROUP BY t.pid "
                    "HAVING COUNT(*) > 1"
                )
                return f"SELECT COUNT(*) FROM {table} AS o WHERE o.pid IN ({inner})"
            if exists:
                # In parentheses: an OR at the top would take the tie into it.
                more = f" AND ({_sql(compared)})" if compared is not None else ""
                inner = f"SELECT 1 FROM {table} WHERE t.pid = o.pid AND ({_sql(cond)}){more}"
                negated = "NOT " if exists == "not" else ""
                return f"SELECT COUNT(*) FROM {table} AS o WHERE {negated}EXISTS ({inner})"
            inner = f"SELECT t.pid FROM {table} WHERE {_sql(cond)}"
            return f"SELECT COUNT(*) FROM {table} AS o WHERE o.pid IN ({inner})"

        picks = st.lists(st.booleans(), max_size=3).map(lambda rest: [True, *rest])
        compared = st.tuples(self.expr(BOOL), picks).map(lambda t: _mixed(*t)) | st.none()
        return st.tuples(
            self.expr(BOOL), st.sampled_from([True, False, None, "not"]), compared
        ).map(render)

    def left_joined(self, table: str) -> st.SearchStrategy[str]:
        """A row condition in a LEFT JOIN's ``ON``, beside the join on the unit
        (``table`` is ``a JOIN b ON <units>``, made a LEFT JOIN here)."""
        left = table.replace(" JOIN ", " LEFT JOIN ", 1)
        return self.expr(BOOL).map(lambda c: f"SELECT COUNT(*) FROM {left} AND {_sql(c)}")

    def released(self, table: str) -> st.SearchStrategy[str]:
        """Release-level expressions over aggregates: arithmetic in the SELECT list,
        ``HAVING`` and ``ORDER BY`` on noisy values, with public group keys."""

        def render(t: tuple) -> str:
            a, b, op, lit, having, order = t
            out = f"SELECT {a} {op} {b} AS r, {a} AS a FROM {table}"
            if having is not None or order:
                out = (
                    f"SELECT t.city AS k, {a} {op} {b} AS r, {a} AS a FROM {table} GROUP BY k"
                    + (f" HAVING {a} {having} {lit}" if having else "")
                    + (" ORDER BY r DESC" if order else "")
                )
            return out

        aggs = st.sampled_from(TEMPLATES).flatmap(
            lambda tpl: self.expr(NUM, 1).map(lambda e: _sql(aggregate(tpl, e)))
        )
        return st.tuples(
            aggs | st.just("COUNT(*)"),
            aggs | st.just("COUNT(*)"),
            st.sampled_from(["+", "-", "*", "/", "//", "%"]),
            ints.map(lambda v: _sql(int_literal(v))),
            st.none() | st.sampled_from(["<", ">", "="]),
            st.booleans(),
        ).map(render)


def swarm(schemas: dict[str, Schema], placement: str = "row_query") -> st.SearchStrategy[str]:
    """Queries over one of ``schemas`` (FROM clause -> schema), each from a grammar with a
    random subset of the allowed node types switched on: swarm testing (Groce et al.,
    ISSTA 2012). A narrow grammar nests its few operators densely (a TRY_CAST to TINYINT
    under an addition), which the full grammar reaches rarely; and shrinking switches
    node types off, towards the smallest grammar that still fails."""
    switchable = [n for n in ROW_NODES if n not in LEAVES]

    @st.composite
    def draw_query(draw: st.DrawFn) -> str:
        table = draw(st.sampled_from(sorted(schemas)))
        on = draw(st.lists(st.booleans(), min_size=len(switchable), max_size=len(switchable)))
        enabled = frozenset(n for n, flag in zip(switchable, on, strict=True) if flag)
        grammar = Grammar(schemas[table], enabled=enabled)
        return draw(getattr(grammar, placement)(table))

    return draw_query()


def _itself(strategy: Strategy) -> Strategy:
    return strategy


@st.composite
def _drawn(draw: st.DrawFn, grammar: Grammar, family: str, depth: int) -> exp.Expression:
    """A lazy draw: the grammar is recursive, and a strategy's repr (which Hypothesis
    computes) would otherwise spell out the whole tree of alternatives."""
    return draw(grammar.options(family, depth))


def _sql(node: exp.Expression) -> str:
    return node.sql(dialect=DIALECT)


def _mixed(node: exp.Expression, picks: list[bool]) -> exp.Expression:
    """``node`` with some of its ``t.…`` columns naming the query's row ``o`` instead
    (the ``i``-th column where ``picks`` holds true, cycling; the first always): a
    condition between a semi-join's row and the query's."""
    out = node.copy()
    columns = [c for c in out.find_all(exp.Column) if c.table == "t"]
    for i, column in enumerate(columns):
        if picks[i % len(picks)]:
            column.set("table", exp.to_identifier("o"))
    return out
