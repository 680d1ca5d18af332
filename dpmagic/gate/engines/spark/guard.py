"""The execution guard for Spark: an allow-list over the SQL Spark is given.

The rendered text is parsed again (sqlglot's Spark dialect, not the tree the
rewrite built) and every node checked, so that even SQL the analysis wrongly let
through could read nothing but the prepared tables and call nothing but the
functions the gate generates:

* one ``SELECT`` (with its CTEs), no second statement, no command;
* tables: only the dataset's declared tables, unqualified, and the query's own
  CTEs (no catalog or database name, no file path, no table function);
* functions: only those the rewrite and the allowed row expressions produce, by
  sqlglot node type, plus ``xxhash64``; so no ``reflect``/``java_method``, no
  ``read_files``, no UDF, no catalog, file or session function, no aggregate
  that returns row values (``first``, …), no generator; a list aggregate only as
  a quantile's counts per candidate, ``MAP_FROM_ENTRIES(COLLECT_LIST(STRUCT(c, n)))``
  over two plain columns;
* no sampling clause, no lateral view, no hint.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dpmagic.gate.failures import Refused

# The functions generated SQL may call, by sqlglot node type.
FUNCTIONS: tuple[type[exp.Expression], ...] = (
    exp.Sum, exp.Count, exp.RowNumber, exp.DenseRank, exp.Cast, exp.TryCast, exp.Round, exp.Abs,
    exp.Floor, exp.Ceil, exp.Sqrt, exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif,
    exp.If, exp.Case, exp.Upper, exp.Lower, exp.Trim, exp.Substring, exp.Left, exp.Right,
    exp.Length, exp.Year, exp.Month, exp.Day, exp.DayOfMonth, exp.Quarter, exp.DayOfYear,
    exp.Extract, exp.Concat, exp.DPipe, exp.Max, exp.Min, exp.And, exp.Or, exp.Not,
    # sqlglot reads Spark's YEAR(d) as YEAR(TO_DATE(d)): the parse, not a call written
    exp.TsOrDsToDate,
    # A semi-join comparing its rows with the query's row: a predicate over a subquery
    # whose tables and functions this list vets as any other part of the SQL.
    exp.Exists,
)  # fmt: skip
NAMED_FUNCTIONS = frozenset({"xxhash64"})
FORBIDDEN: tuple[type[exp.Expression], ...] = (
    exp.TableSample, exp.Lateral, exp.Hint, exp.Command, exp.Into, exp.Unnest, exp.Explode,
)  # fmt: skip


class UnsafeSparkSQL(Refused):
    """SQL the Spark guard will not run: a bug of the gate's, caught before the debit."""

    def __init__(self) -> None:
        super().__init__("the gate will not run the SQL it generated for this query")


def guard(sql: str, tables: frozenset[str], allowed: tuple[type[exp.Expression], ...] = ()) -> None:
    """Raise ``UnsafeSparkSQL`` unless ``sql`` passes (see the module's docstring);
    ``allowed``: more node types a plain read of public tables may hold, whose tree
    the gate vetted already (``public_reads.py``)."""
    try:
        statements = sqlglot.parse(sql, dialect="spark")
    except sqlglot.errors.ParseError:
        raise UnsafeSparkSQL() from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise UnsafeSparkSQL()
    tree = statements[0]
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for node in tree.walk():
        if isinstance(node, FORBIDDEN) or not _allowed(node, tables | ctes, allowed):
            raise UnsafeSparkSQL()


def _histogram_part(node: exp.Expression) -> bool:
    """``MAP_FROM_ENTRIES(COLLECT_LIST(STRUCT(__c, __n)))`` read straight from a subquery
    ``__counted`` whose ``__n`` is a ``COUNT(*)``: a quantile's counts per candidate
    gathered into a map (``rewrite._histograms_apart``), the one use of a list
    aggregate the gate makes. Any other list would carry a row's values."""
    gathered = node if isinstance(node, exp.MapFromEntries) else node.parent
    if isinstance(node, exp.Struct):
        gathered = node.parent.parent if node.parent else None
    if not isinstance(gathered, exp.MapFromEntries):
        return False
    listed = gathered.this
    if not isinstance(listed, exp.ArrayAgg) or not isinstance(listed.this, exp.Struct):
        return False
    fields = [f.expression if isinstance(f, exp.PropertyEQ) else f for f in listed.this.expressions]
    if [f.name if isinstance(f, exp.Column) else None for f in fields] != ["__c", "__n"]:
        return False
    select = gathered.find_ancestor(exp.Select)
    source = select.args.get("from_") if select else None
    counted = source.this if source else None
    if not isinstance(counted, exp.Subquery) or counted.alias != "__counted":
        return False
    inner = counted.this
    if not isinstance(inner, exp.Select):
        return False
    named = {e.alias: e.this for e in inner.expressions if isinstance(e, exp.Alias)}
    count, candidate = named.get("__n"), named.get("__c")
    # The candidate is a kept row's snapped index (``__v_<quantile>``), never a column.
    return (
        isinstance(count, exp.Count)
        and isinstance(count.this, exp.Star)
        and isinstance(candidate, exp.Column)
        and candidate.name.startswith("__v_")
    )


def _allowed(
    node: exp.Expr,
    names: frozenset[str] | set[str],
    allowed: tuple[type[exp.Expression], ...] = (),
) -> bool:
    if isinstance(node, exp.Table):
        return (
            isinstance(node.this, exp.Identifier)
            and not node.args.get("db")
            and not node.args.get("catalog")
            and node.name.lower() in names
        )
    if isinstance(node, exp.MapFromEntries | exp.ArrayAgg | exp.Struct):
        return _histogram_part(node)
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower() in NAMED_FUNCTIONS
    if isinstance(node, exp.Func):
        return isinstance(node, FUNCTIONS + allowed)
    return True
