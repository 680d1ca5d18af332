"""Pass 3: the allow-list, and what each part of the query is.

Every node of the tree must be of an allowed type for where it stands:
row-level expressions (``WHERE``, aggregate arguments, group keys) may use
columns, literals, arithmetic, comparisons, boolean logic, ``CASE`` and a
few total functions; release-level expressions (``SELECT`` list, ``HAVING``,
``ORDER BY``) may combine group keys and DP aggregates with the same
operators. Anything else (table functions, catalog functions, ``error()``,
sleeps, window functions, casts that can fail on data) is refused, naming the
construct, before the data is touched.

Released expressions leave this pass *normalised*: each aggregate is replaced
by a column ``__a<i>`` naming its :class:`AggregateCall` and each group key
by ``__k<i>``, so later passes never match SQL text. ``FILTER (WHERE c)``
becomes a ``CASE WHEN c THEN … END`` argument, which keeps the one
contribution-bounding path for every aggregate.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.quantile import fraction
from dpmagic.gate.sql.aggregates.registry import call_argument, kind_of_call
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.trees import display, unparen

# Operators and total functions, allowed both on rows and on released values.
SCALAR_NODES: tuple[type[exp.Expression], ...] = (
    exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Neg,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.And, exp.Or, exp.Not, exp.Is, exp.In, exp.Between,
    exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least,
    exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Sqrt,
    exp.TryCast, exp.DataType,
)  # fmt: skip
# Parts of a date column (integers with known ranges), by function and by EXTRACT unit.
DATE_PARTS: dict[type[exp.Expression], str] = {
    exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day",
    exp.Quarter: "quarter", exp.DayOfWeek: "dow", exp.DayOfYear: "doy", exp.WeekOfYear: "week",
}  # fmt: skip
EXTRACT_UNITS = {
    "YEAR": "year", "MONTH": "month", "DAY": "day", "QUARTER": "quarter", "DOW": "dow",
    "DAYOFWEEK": "dow", "DOY": "doy", "DAYOFYEAR": "doy", "WEEK": "week",
}  # fmt: skip
# Text functions that cannot fail on any text: their first argument must be text
# (DuckDB would not bind them on anything else, after the budget is charged), and
# positions and lengths integer literals (a cast of a row's number could overflow).
TEXT_FUNCTIONS: tuple[type[exp.Expression], ...] = (
    exp.Upper, exp.Lower, exp.Trim, exp.Substring, exp.Left, exp.Right, exp.Length,
)  # fmt: skip
# The largest position or length a text function takes (DuckDB's own limit is 2^32).
TEXT_POSITION_LIMIT = 2**31
# Concatenation casts any operand to text, which never fails.
CONCATENATION = (exp.DPipe, exp.Concat)
# String matching against literal patterns: no regexes built from data.
ROW_ONLY_NODES: tuple[type[exp.Expression], ...] = (
    exp.Column, exp.Like, exp.ILike, exp.Extract, exp.Var, *DATE_PARTS,
    *TEXT_FUNCTIONS, *CONCATENATION,
)  # fmt: skip
CAST_TYPES = {
    exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT, exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT,
    exp.DataType.Type.BOOLEAN,
}  # fmt: skip
NEVER_AGGREGATES = (
    exp.ArrayAgg, exp.GroupConcat, exp.AnyValue, exp.First, exp.Last, exp.ArgMax, exp.ArgMin,
    exp.Mode,
)  # fmt: skip


@dataclass(frozen=True)
class AggregateCall:
    """A DP aggregate the query asks for, once however often it is written.

    ``func`` is its kind's function in the catalogue (``aggregates.registry``); a
    quantile's ``level`` is where it stands (MIN, MAX and MEDIAN are the quantiles at
    0, 1 and 0.5). ``name`` is the column standing for it in released trees.
    """

    name: str
    func: AggregateFunc
    arg: exp.Expression | None  # None for COUNT(*)
    label: str  # the SQL as written, for display
    level: float | None = None


@dataclass(frozen=True)
class GroupKey:
    name: str  # __k<i>: the column standing for it in released trees and generated SQL
    expr: exp.Expression  # the row expression grouped by, columns qualified
    label: str


@dataclass(frozen=True)
class Output:
    name: str
    expr: exp.Expression  # normalised: literals, operators, __a<i> and __k<i> columns


@dataclass(frozen=True)
class Checked:
    resolved: Resolved
    keys: tuple[GroupKey, ...]
    outputs: tuple[Output, ...]
    aggregates: tuple[AggregateCall, ...]
    where: exp.Expression | None
    having: exp.Expression | None
    order: tuple[exp.Ordered, ...]
    limit: int | None
    offset: int | None

    def aggregate(self, name: str) -> AggregateCall:
        return next(a for a in self.aggregates if a.name == name)


def check(resolved: Resolved) -> Checked:
    tree = resolved.tree
    _refuse_unsupported_clauses(tree)
    for item in tree.expressions:
        if isinstance(item, exp.Star):
            raise Refused("SELECT * would release rows: select aggregates instead")
    where = tree.args.get("where")
    if where is not None:
        _row_expr(where.this, resolved, "WHERE")
    # Every other place a row expression is evaluated on private rows: a LEFT JOIN's
    # condition, and a semi-join's subquery (its WHERE, its value, what it is matched
    # with) take the same rules as WHERE, not only the work bound's prices.
    for scan in resolved.scans:
        if scan.on is not None:
            _row_expr(scan.on, resolved, "ON")
    for per in (s.per_unit for s in resolved.scans if s.per_unit is not None):
        if per.where is not None:
            _row_expr(per.where, resolved, "a per-person subquery's WHERE")
        for scan in per.scans:
            if scan.on is not None:
                _row_expr(scan.on, resolved, "ON")
        for _, key in per.keys:
            _row_expr(key, resolved, "a per-person subquery's GROUP BY")
        for _, value in per.values:  # the aggregates' arguments are row expressions
            for agg in value.find_all(exp.AggFunc):
                args = agg.this.expressions if isinstance(agg.this, exp.Distinct) else [agg.this]
                for a in args:
                    if not isinstance(a, exp.Star):
                        _row_expr(a, resolved, f"{_name(agg)}(…) per person")
    for j in resolved.semijoins:
        for part in (j.lhs, j.value, *(t for t in (j.where, j.correlated) if t is not None)):
            _row_expr(part, resolved, "IN (SELECT …)" if not j.exists else "EXISTS (…)")
        for agg in j.having.find_all(exp.AggFunc) if j.having is not None else ():
            if not isinstance(agg.this, exp.Star):
                _row_expr(agg.this, resolved, f"{_name(agg)}(…) in HAVING")
        for scan in j.scans:
            if scan.on is not None:
                _row_expr(scan.on, resolved, "ON")
    keys = _group_keys(resolved, tree)
    release = _Release(resolved, keys)

    outputs = []
    for item in tree.expressions:
        expr = item.this if isinstance(item, exp.Alias) else item
        outputs.append(Output(name=_output_name(item, expr), expr=release.normalise(expr)))
    aliases = frozenset(o.name.lower() for o in outputs)
    having = tree.args.get("having")
    having_expr = release.normalise(having.this, aliases) if having is not None else None
    order = tree.args.get("order")
    ordered = tuple(
        _ordered(o, release.normalise(o.this, aliases))
        for o in (order.expressions if order is not None else [])
    )
    if not release.aggregates and not keys:
        raise Refused("the query releases no aggregate: use COUNT, SUM, AVG, MEDIAN, …")
    return Checked(
        resolved=resolved,
        keys=keys,
        outputs=tuple(outputs),
        aggregates=tuple(release.aggregates.values()),
        where=where.this if where is not None else None,
        having=having_expr,
        order=ordered,
        limit=_count(tree, "limit"),
        offset=_count(tree, "offset"),
    )


def _ordered(o: exp.Ordered, this: exp.Expression) -> exp.Ordered:
    out = o.copy()
    out.set("this", this)
    return out


def _refuse_unsupported_clauses(tree: exp.Select) -> None:
    if tree.args.get("distinct"):
        raise Refused("SELECT DISTINCT is not supported: GROUP BY the public keys instead")
    for key, name in (("qualify", "QUALIFY"), ("windows", "WINDOW"), ("into", "INTO"),
                      ("laterals", "LATERAL"), ("pivots", "PIVOT"), ("prewhere", "PREWHERE"),
                      ("connect", "CONNECT BY"), ("match", "MATCH_RECOGNIZE")):  # fmt: skip
        if tree.args.get(key):
            raise Refused(f"{name} is not allowed")
    for node in tree.walk():
        if isinstance(node, exp.Window):
            raise Refused("window functions (OVER) would release row values")


def _group_keys(resolved: Resolved, tree: exp.Select) -> tuple[GroupKey, ...]:
    group = tree.args.get("group")
    if group is None:
        return ()
    for key in ("rollup", "cube", "grouping_sets"):
        if group.args.get(key):
            raise Refused("ROLLUP, CUBE and GROUPING SETS are not supported yet")
    if group.args.get("all"):
        raise Refused("GROUP BY ALL is not supported: name the keys")
    outputs = {
        item.alias.lower(): item.this for item in tree.expressions if isinstance(item, exp.Alias)
    }
    keys: list[GroupKey] = []
    for node in group.expressions:
        expr = node
        if isinstance(node, exp.Literal) and node.is_int:
            position = int(node.this)
            if not 1 <= position <= len(tree.expressions):
                raise Refused(f"GROUP BY {position}: there is no output column {position}")
            item = tree.expressions[position - 1]
            expr = item.this if isinstance(item, exp.Alias) else item
        elif isinstance(node, exp.Column) and not node.table:
            if node.name.lower() not in outputs:
                raise Refused(f"GROUP BY {node.name}: no such column or output")
            expr = outputs[node.name.lower()]
        label = display(node)
        if any(isinstance(n, exp.AggFunc | exp.Filter) for n in expr.walk()):
            raise Refused(f"GROUP BY {label}: a group key cannot be an aggregate")
        _row_expr(expr, resolved, f"GROUP BY {label}")
        if resolved.is_unit(unparen(expr)):
            raise Refused(
                f"grouping by the privacy unit {label!r} would release each unit's values: "
                "a list or top-k of individuals is never released. Ask for a statistic over "
                "them (AVG, a quantile) or a top-k of public keys (GROUP BY a public column, "
                "ORDER BY the aggregate, LIMIT k)"
            )
        if resolved.within_unit(unparen(expr)):
            raise Refused(
                f"each group of GROUP BY {label} holds one person's rows (its key lies within "
                "one unit along the declared links): a list of individuals is never released. "
                f"Ask for their distribution: SELECT n, COUNT(*) FROM (SELECT {label}, COUNT(*) "
                f"AS n … GROUP BY {label}) GROUP BY n"
            )
        if any(k.expr.sql(dialect=DIALECT) == expr.sql(dialect=DIALECT) for k in keys):
            continue
        keys.append(GroupKey(name=f"__k{len(keys)}", expr=expr.copy(), label=label))
    return tuple(keys)


class _Release:
    """Normalises released expressions, collecting the aggregates they use."""

    def __init__(self, resolved: Resolved, keys: tuple[GroupKey, ...]) -> None:
        self.resolved = resolved
        self.keys = {k.expr.sql(dialect=DIALECT): k for k in keys}
        self.aggregates: dict[str, AggregateCall] = {}

    def normalise(
        self, node: exp.Expression, aliases: frozenset[str] = frozenset()
    ) -> exp.Expression:
        key = self.keys.get(node.sql(dialect=DIALECT))
        if key is not None:
            return exp.column(key.name)
        agg = self._aggregate(node)
        if agg is not None:
            return exp.column(agg.name)
        if isinstance(node, exp.Column):
            if not node.table and node.name.lower() in aliases:
                return exp.column(node.name.lower())
            raise Refused(f"column {node.name!r} must be inside an aggregate or listed in GROUP BY")
        _allowed(node, SCALAR_NODES, "in a released value")
        out = node.copy()
        for arg, value in node.args.items():
            if isinstance(value, exp.Expression):
                out.set(arg, self.normalise(value, aliases))
            elif isinstance(value, list):
                out.set(
                    arg,
                    [
                        self.normalise(v, aliases) if isinstance(v, exp.Expression) else v
                        for v in value
                    ],
                )
        return out

    def _aggregate(self, node: exp.Expression) -> AggregateCall | None:
        condition = None
        whole = node  # its label (``display``) is rendered only once it is an aggregate
        if isinstance(node, exp.Filter):
            condition = node.expression.this
            node = node.this
        if isinstance(node, NEVER_AGGREGATES):
            raise Refused(f"{_name(node)} returns data values and is never allowed")
        if isinstance(node, exp.WithinGroup):
            return self._within_group(node, display(whole), condition)
        if not isinstance(node, exp.AggFunc):
            return None
        kind = kind_of_call(node)
        if kind is None:
            raise Refused(f"aggregate {_name(node)} is not supported")
        arg = call_argument(node)
        if isinstance(arg, exp.Distinct):
            if kind.distinct is None or len(arg.expressions) != 1:
                raise Refused(f"{_name(node)}(DISTINCT …) is not supported: use COUNT(DISTINCT x)")
            kind, arg = kind.distinct, arg.expressions[0]
        if kind.star and isinstance(arg, exp.Star):
            arg = None
        elif arg is None or isinstance(arg, exp.Star):
            raise Refused(f"{_name(node)} needs an argument")
        else:
            arg = kind.argument(arg)
        level = kind.level(node)
        if condition is not None:
            _row_expr(condition, self.resolved, "FILTER (WHERE …)")
            then = exp.Literal.number(1) if arg is None else arg.copy()
            arg = exp.Case(ifs=[exp.If(this=condition.copy(), true=then)])
        if arg is not None:
            if any(isinstance(n, exp.AggFunc | exp.Filter) for n in arg.walk()):
                raise Refused("aggregates cannot be nested")
            _row_expr(arg, self.resolved, f"{_name(node)}(…)")
        return self._add(kind.func, arg, display(whole), level)

    def _within_group(
        self, node: exp.WithinGroup, label: str, condition: exp.Expression | None
    ) -> AggregateCall:
        inner = node.this
        order = node.expression
        if not isinstance(inner, exp.PercentileCont | exp.PercentileDisc) or not isinstance(
            order, exp.Order
        ):
            raise Refused(f"{_name(inner)} … WITHIN GROUP is not supported")
        if len(order.expressions) != 1:
            raise Refused("WITHIN GROUP (ORDER BY …) takes one expression")
        ordered = order.expressions[0]
        level = fraction(inner.this, label)
        if ordered.args.get("desc"):
            level = 1.0 - level
        arg = ordered.this
        if condition is not None:
            _row_expr(condition, self.resolved, "FILTER (WHERE …)")
            arg = exp.Case(ifs=[exp.If(this=condition.copy(), true=arg.copy())])
        _row_expr(arg, self.resolved, f"{_name(inner)}(…)")
        return self._add(AggregateFunc.QUANTILE, arg, label, level)

    def _add(
        self, func: AggregateFunc, arg: exp.Expression | None, label: str, level: float | None
    ) -> AggregateCall:
        identity = f"{func}|{level}|{'*' if arg is None else arg.sql(dialect=DIALECT)}"
        if identity not in self.aggregates:
            self.aggregates[identity] = AggregateCall(
                name=f"__a{len(self.aggregates)}", func=func, arg=arg, label=label, level=level
            )
        return self.aggregates[identity]


def _row_expr(node: exp.Expression, resolved: Resolved, where: str) -> None:
    """An expression evaluated on each private row."""
    for n in node.walk():
        if isinstance(n, _NOT_IN_ROWS):
            raise Refused(f"aggregates cannot be nested or used in {where}: {_name(n)}")
        if isinstance(n, exp.Column) and resolved.column(n) is None:
            raise Refused(f"{n.name!r} in {where} is not a column of a declared table")
        if _date_literal(n):
            continue
        if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast):
            raise Refused("CAST can fail on data: use TRY_CAST")
        if isinstance(n, exp.Var) and not isinstance(n.parent, exp.Extract):
            raise Refused(f"{n.name} is not allowed in {where}")
        if isinstance(n, _EXTRACTS):
            _date_part(n, resolved)
        if isinstance(n, exp.TryCast) and n.to.this not in CAST_TYPES:
            raise Refused(f"TRY_CAST to {n.to.sql(dialect=DIALECT)} is not supported")
        if isinstance(n, _LIKES) and not isinstance(n.expression, exp.Literal):
            raise Refused("LIKE needs a literal pattern")
        if isinstance(n, TEXT_FUNCTIONS):
            _text_function(n, resolved)
        if isinstance(n, COMPARISONS):
            _comparable(n, resolved)
        if isinstance(n, ARITHMETIC):
            for operand in (n.this, n.args.get("expression")):
                if operand is not None and _family(operand, resolved) in ("text", "date"):
                    raise Refused(f"{display(n)}: arithmetic needs numbers, not text or dates")
        _allowed(n, _ROW_NODES, f"in {where}")


# The classes ``_row_expr`` and ``_allowed`` test each node for, as tuples built once
# (written inline, each node's test built them anew).
_NOT_IN_ROWS = (exp.AggFunc, exp.Filter, *NEVER_AGGREGATES)
_EXTRACTS: tuple[type[exp.Expression], ...] = (exp.Extract, *DATE_PARTS)
_LIKES = (exp.Like, exp.ILike)
_ROW_NODES = SCALAR_NODES + ROW_ONLY_NODES + (exp.Identifier,)
_NAMES = (exp.Identifier, exp.Star)
_NULLS_TREATMENT = (exp.IgnoreNulls, exp.RespectNulls)


COMPARISONS = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.In, exp.Between,
)  # fmt: skip
ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Abs)
_FAMILIES = {"int": "number", "float": "number", "bool": "number", "str": "text", "date": "date"}


def _comparable(node: exp.Expression, resolved: Resolved) -> None:
    """Refuse comparing a column with a value of another kind: DuckDB would cast
    one side, and a cast that fails on some row is an error that depends on data."""
    operands = [node.this, node.args.get("expression")]
    operands += node.args.get("expressions") or []
    operands += [node.args.get("low"), node.args.get("high")]
    kinds = {f for o in operands if o is not None and (f := _family(o, resolved)) is not None}
    if "date" in kinds and kinds <= {"date", "text"}:
        for o in operands:
            if isinstance(o, exp.Literal) and o.is_string:
                try:
                    dt.date.fromisoformat(o.this)
                except ValueError:
                    raise Refused(f"{o.this!r} is not a date (use YYYY-MM-DD)") from None
        return
    if len(kinds) > 1:
        raise Refused(f"{display(node)} compares {' with '.join(sorted(kinds))}")


def _text_function(node: exp.Expression, resolved: Resolved) -> None:
    if _family(node.this, resolved) != "text":
        raise Refused(f"{display(node)}: {_name(node)} needs a text column or text value")
    for key in ("start", "length", "expression"):
        arg = node.args.get(key)
        if arg is None:
            continue
        if isinstance(node, exp.Trim):
            if not (isinstance(arg, exp.Literal) and arg.is_string):
                raise Refused(f"{display(node)}: TRIM takes literal characters")
        elif not (isinstance(arg, exp.Literal) and arg.is_int):
            raise Refused(f"{display(node)}: positions and lengths must be integer literals")
        elif abs(int(arg.this)) > TEXT_POSITION_LIMIT:
            # DuckDB raises on every row for a position or length beyond ±2^32.
            raise Refused(
                f"{display(node)}: positions and lengths must lie within ±{TEXT_POSITION_LIMIT:,}"
            )


def _family(node: exp.Expression, resolved: Resolved) -> str | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Length):
        return "number"
    if isinstance(node, TEXT_FUNCTIONS + CONCATENATION):
        return "text"
    col = resolved.column(node)
    if col is not None:
        return _FAMILIES.get(col.type)
    if _date_literal(node):
        return "date"
    if isinstance(node, exp.Literal):
        return "text" if node.is_string else "number"
    if isinstance(node, exp.Boolean):
        return "number"
    return None


def date_part(node: exp.Expression) -> str | None:
    """Which part of a date ``node`` extracts (year, month, …), if it is a date part."""
    if isinstance(node, exp.Extract):
        return EXTRACT_UNITS.get(node.this.name.upper())
    return DATE_PARTS.get(type(node))


def _date_part(node: exp.Expr, resolved: Resolved) -> None:
    """A date part must read a date column or literal: anything else would fail in
    DuckDB after the budget is charged."""
    if not isinstance(node, exp.Expression):  # an abstract node type: none is parsed
        raise Refused(f"{_name(node)} is not allowed")
    part = date_part(node)
    if part is None:
        raise Refused(f"{display(node)}: extract one of {', '.join(EXTRACT_UNITS)}")
    arg = node.expression if isinstance(node, exp.Extract) else node.this
    col = resolved.column(arg)
    if not (_date_literal(arg) or (col is not None and col.type == "date")):
        raise Refused(f"{display(node)}: date parts need a date column")


def _date_literal(node: exp.Expr) -> bool:
    """``DATE '2020-01-01'``: a cast that cannot fail, once its text is a valid date."""
    if not (
        type(node) is exp.Cast
        and node.to.this == exp.DataType.Type.DATE
        and isinstance(node.this, exp.Literal)
        and node.this.is_string
    ):
        return False
    try:
        dt.date.fromisoformat(node.this.this)
    except ValueError:
        raise Refused(f"{node.this.this!r} is not a date (use YYYY-MM-DD)") from None
    return True


def _allowed(node: exp.Expr, allowed: tuple[type[exp.Expr], ...], where: str) -> None:
    if _date_literal(node):
        return
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
        raise Refused("CAST can fail on data: use TRY_CAST")
    if isinstance(node, _NAMES):
        return
    if isinstance(node, _NULLS_TREATMENT):
        node = node.this
    if isinstance(node, NEVER_AGGREGATES):
        raise Refused(f"{_name(node)} returns data values and is never allowed")
    if not isinstance(node, allowed):
        raise Refused(f"{_name(node)} is not allowed {where}")


def _name(node: exp.Expr) -> str:
    if isinstance(node, exp.IgnoreNulls | exp.RespectNulls):
        return _name(node.this)
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}()"
    if isinstance(node, exp.AnonymousAggFunc):
        return node.name
    if isinstance(node, exp.Func):
        return node.sql_name()
    return type(node).__name__.upper()


def _output_name(item: exp.Expression, expr: exp.Expression) -> str:
    if isinstance(item, exp.Alias):
        return item.alias
    if isinstance(expr, exp.Column):
        return expr.name
    return display(expr)


def _count(tree: exp.Select, key: str) -> int | None:
    node = tree.args.get(key)
    if node is None:
        return None
    value = node.expression
    if not (isinstance(value, exp.Literal) and value.is_int) or int(value.this) < 0:
        raise Refused(f"{key.upper()} takes a non-negative whole number")
    return int(value.this)
