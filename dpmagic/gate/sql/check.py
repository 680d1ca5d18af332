"""Pass 3: the allow-list, and what each part of the query is.

Every node of the tree must be of an allowed type for where it stands:
row-level expressions (``WHERE``, aggregate arguments) may use columns,
literals, arithmetic, comparisons, boolean logic, ``CASE`` and a few total
functions; release-level expressions (``SELECT`` list, ``HAVING``,
``ORDER BY``) may combine group keys and DP aggregates with the same
operators. Anything else (table functions, catalog functions, ``error()``,
sleeps, window functions, subqueries, casts that can fail on data) is
refused, naming the construct, before the data is touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.errors import Refused
from dpmagic.gate.policy import Column
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.resolve import Resolved

AGGREGATES: dict[type[exp.Expression], str] = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg"}

# Operators and total functions, allowed both on rows and on released values.
SCALAR_NODES: tuple[type[exp.Expression], ...] = (
    exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Neg,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.And, exp.Or, exp.Not, exp.Is, exp.In, exp.Between,
    exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least,
    exp.Abs, exp.Round, exp.Floor, exp.Ceil,
    exp.TryCast, exp.DataType,
)  # fmt: skip
# String matching against literal patterns: no regexes built from data.
ROW_ONLY_NODES: tuple[type[exp.Expression], ...] = (exp.Column, exp.Like, exp.ILike)
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
    """A DP aggregate the query asks for, once however often it is written."""

    func: str  # count | sum | avg
    arg: exp.Expression | None  # None for COUNT(*)
    label: str  # canonical SQL, also the identity used to share a measurement


@dataclass(frozen=True)
class Output:
    name: str
    expr: exp.Expression


@dataclass(frozen=True)
class Checked:
    resolved: Resolved
    keys: tuple[Column, ...]
    outputs: tuple[Output, ...]
    aggregates: tuple[AggregateCall, ...]
    where: exp.Expression | None
    having: exp.Expression | None
    order: tuple[exp.Ordered, ...]
    limit: int | None
    offset: int | None


def check(resolved: Resolved) -> Checked:
    tree = resolved.tree
    _refuse_unsupported_clauses(tree)
    keys = tuple(_group_key(resolved, node) for node in _group_nodes(tree))
    key_names = {k.name for k in keys}
    aggregates: dict[str, AggregateCall] = {}

    outputs = []
    for item in tree.expressions:
        if isinstance(item, exp.Star):
            raise Refused("SELECT * would release rows: select aggregates instead")
        expr = item.this if isinstance(item, exp.Alias) else item
        _release_expr(expr, resolved, key_names, aggregates)
        outputs.append(Output(name=_output_name(item, expr), expr=expr))

    where = tree.args.get("where")
    if where is not None:
        _row_expr(where.this, resolved, "WHERE")
    having = tree.args.get("having")
    if having is not None:
        _release_expr(having.this, resolved, key_names, aggregates, aliases=_aliases(outputs))
    order = tree.args.get("order")
    ordered = tuple(order.expressions) if order is not None else ()
    for o in ordered:
        _release_expr(o.this, resolved, key_names, aggregates, aliases=_aliases(outputs))
    if not aggregates and not keys:
        raise Refused("the query releases no aggregate: use COUNT, SUM or AVG")
    return Checked(
        resolved=resolved,
        keys=keys,
        outputs=tuple(outputs),
        aggregates=tuple(aggregates.values()),
        where=where.this if where is not None else None,
        having=having.this if having is not None else None,
        order=ordered,
        limit=_count(tree, "limit"),
        offset=_count(tree, "offset"),
    )


def _refuse_unsupported_clauses(tree: exp.Select) -> None:
    if tree.args.get("distinct"):
        raise Refused("SELECT DISTINCT is not supported: GROUP BY the public keys instead")
    for key, name in (("qualify", "QUALIFY"), ("windows", "WINDOW"), ("into", "INTO"),
                      ("laterals", "LATERAL"), ("pivots", "PIVOT"), ("prewhere", "PREWHERE"),
                      ("connect", "CONNECT BY"), ("match", "MATCH_RECOGNIZE")):  # fmt: skip
        if tree.args.get(key):
            raise Refused(f"{name} is not allowed")
    for node in tree.walk():
        if isinstance(node, exp.Subquery | exp.Exists) or (
            isinstance(node, exp.Select) and node is not tree
        ):
            raise Refused("subqueries are not supported yet")
        if isinstance(node, exp.Window):
            raise Refused("window functions (OVER) would release row values")
        if isinstance(node, exp.Filter):
            raise Refused(
                "the FILTER clause is not supported yet: use SUM(CASE WHEN … THEN 1 ELSE 0 END)"
            )


def _group_nodes(tree: exp.Select) -> list[exp.Expression]:
    group = tree.args.get("group")
    if group is None:
        return []
    for key in ("rollup", "cube", "grouping_sets"):
        if group.args.get(key):
            raise Refused("ROLLUP, CUBE and GROUPING SETS are not supported yet")
    if group.args.get("all"):
        raise Refused("GROUP BY ALL is not supported: name the key columns")
    return list(group.expressions)


def _group_key(resolved: Resolved, node: exp.Expression) -> Column:
    column = resolved.columns.get(id(node)) if isinstance(node, exp.Column) else None
    if column is None:
        raise Refused(
            f"GROUP BY {node.sql(dialect=DIALECT)}: group by declared columns by name "
            "(expressions and positions are not supported yet)"
        )
    if column.name == resolved.dataset.privacy_unit:
        raise Refused(
            f"grouping by the privacy unit {column.name!r} would release each unit's values"
        )
    if column.public_values is None:
        raise Refused(
            f"GROUP BY {column.name}: declare its public_values in the policy "
            "(private group keys are not supported yet)"
        )
    return column


def _release_expr(
    node: exp.Expression,
    resolved: Resolved,
    keys: set[str],
    aggregates: dict[str, AggregateCall],
    aliases: frozenset[str] = frozenset(),
) -> None:
    """A released value: keys, DP aggregates and literals, combined by allowed operators."""
    agg = _aggregate(node, resolved)
    if agg is not None:
        aggregates.setdefault(agg.label, agg)
        return
    if isinstance(node, exp.Column):
        if node.name.lower() in keys and id(node) in resolved.columns:
            return
        if not node.table and node.name.lower() in aliases:
            return
        raise Refused(f"column {node.name!r} must be inside an aggregate or listed in GROUP BY")
    _allowed(node, SCALAR_NODES, "in a released value")
    for child in node.iter_expressions():
        _release_expr(child, resolved, keys, aggregates, aliases)


def _aggregate(node: exp.Expression, resolved: Resolved) -> AggregateCall | None:
    if isinstance(node, NEVER_AGGREGATES):
        raise Refused(f"{_name(node)} returns data values and is never allowed")
    if not isinstance(node, exp.AggFunc):
        return None
    func = AGGREGATES.get(type(node))
    if func is None:
        raise Refused(f"aggregate {_name(node)} is not supported yet: use COUNT, SUM or AVG")
    arg = node.this
    if isinstance(arg, exp.Distinct):
        raise Refused(f"{_name(node)}(DISTINCT …) is not supported yet")
    if func == "count" and isinstance(arg, exp.Star):
        arg = None
    elif arg is None:
        raise Refused(f"{_name(node)} needs an argument")
    else:
        if any(isinstance(n, exp.AggFunc) for n in arg.walk() if n is not arg):
            raise Refused("aggregates cannot be nested")
        _row_expr(arg, resolved, f"{_name(node)}(…)")
    return AggregateCall(func=func, arg=arg, label=node.sql(dialect=DIALECT))


def _row_expr(node: exp.Expression, resolved: Resolved, where: str) -> None:
    """An expression evaluated on each private row."""
    for n in node.walk():
        if isinstance(n, (exp.AggFunc, *NEVER_AGGREGATES)):
            raise Refused(f"aggregates cannot be nested or used in {where}: {_name(n)}")
        if isinstance(n, exp.Column) and id(n) not in resolved.columns:
            raise Refused(f"{n.name!r} in {where} is not a column of {resolved.table.name!r}")
        if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast):
            raise Refused("CAST can fail on data: use TRY_CAST")
        if isinstance(n, exp.TryCast) and n.to.this not in CAST_TYPES:
            raise Refused(f"TRY_CAST to {n.to.sql(dialect=DIALECT)} is not supported")
        if isinstance(n, exp.In) and n.args.get("query") is not None:
            raise Refused("subqueries are not supported yet")
        if isinstance(n, exp.Like | exp.ILike) and not isinstance(n.expression, exp.Literal):
            raise Refused("LIKE needs a literal pattern")
        _allowed(n, SCALAR_NODES + ROW_ONLY_NODES + (exp.Identifier,), f"in {where}")


def _allowed(node: exp.Expression, allowed: tuple[type[exp.Expression], ...], where: str) -> None:
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
        raise Refused("CAST can fail on data: use TRY_CAST")
    if isinstance(node, exp.Identifier | exp.Star):
        return
    if isinstance(node, exp.IgnoreNulls | exp.RespectNulls):
        node = node.this
    if isinstance(node, NEVER_AGGREGATES):
        raise Refused(f"{_name(node)} returns data values and is never allowed")
    if not isinstance(node, allowed):
        raise Refused(f"{_name(node)} is not allowed {where}")


def _name(node: exp.Expression) -> str:
    if isinstance(node, exp.IgnoreNulls | exp.RespectNulls):
        return _name(node.this)
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}()"
    if isinstance(node, exp.Func):
        return node.sql_name()
    return type(node).__name__.upper()


def _output_name(item: exp.Expression, expr: exp.Expression) -> str:
    if isinstance(item, exp.Alias):
        return item.alias
    if isinstance(expr, exp.Column):
        return expr.name
    return expr.sql(dialect=DIALECT)


def _aliases(outputs: list[Output]) -> frozenset[str]:
    return frozenset(o.name.lower() for o in outputs)


def _count(tree: exp.Select, key: str) -> int | None:
    node = tree.args.get(key)
    if node is None:
        return None
    value = node.expression
    if not (isinstance(value, exp.Literal) and value.is_int) or int(value.this) < 0:
        raise Refused(f"{key.upper()} takes a non-negative whole number")
    return int(value.this)
