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
  that returns row values (``collect_list``, ``first``, …), no generator;
* no sampling clause, no lateral view, no hint.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dpmagic.gate.errors import Refused

# The functions generated SQL may call, by sqlglot node type.
FUNCTIONS: tuple[type[exp.Expression], ...] = (
    exp.Sum, exp.Count, exp.RowNumber, exp.DenseRank, exp.Cast, exp.TryCast, exp.Round, exp.Abs,
    exp.Floor, exp.Ceil, exp.Sqrt, exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif,
    exp.If, exp.Case, exp.Upper, exp.Lower, exp.Trim, exp.Substring, exp.Left, exp.Right,
    exp.Length, exp.Year, exp.Month, exp.Day, exp.DayOfMonth, exp.Quarter, exp.DayOfYear,
    exp.Extract, exp.Concat, exp.DPipe, exp.Max, exp.Min, exp.And, exp.Or, exp.Not,
    # sqlglot reads Spark's YEAR(d) as YEAR(TO_DATE(d)): the parse, not a call written
    exp.TsOrDsToDate,
)  # fmt: skip
NAMED_FUNCTIONS = frozenset({"xxhash64"})
FORBIDDEN: tuple[type[exp.Expression], ...] = (
    exp.TableSample, exp.Lateral, exp.Hint, exp.Command, exp.Into, exp.Unnest, exp.Explode,
)  # fmt: skip


class UnsafeSparkSQL(Refused):
    """SQL the Spark guard will not run: a bug of the gate's, caught before the debit."""

    def __init__(self) -> None:
        super().__init__("the gate will not run the SQL it generated for this query")


def guard(sql: str, tables: frozenset[str]) -> None:
    """Raise ``UnsafeSparkSQL`` unless ``sql`` passes (see the module's docstring)."""
    try:
        statements = sqlglot.parse(sql, dialect="spark")
    except sqlglot.errors.ParseError:
        raise UnsafeSparkSQL() from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise UnsafeSparkSQL()
    tree = statements[0]
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for node in tree.walk():
        if isinstance(node, FORBIDDEN) or not _allowed(node, tables | ctes):
            raise UnsafeSparkSQL()


def _allowed(node: exp.Expression, names: frozenset[str] | set[str]) -> bool:
    if isinstance(node, exp.Table):
        return (
            isinstance(node.this, exp.Identifier)
            and not node.args.get("db")
            and not node.args.get("catalog")
            and node.name.lower() in names
        )
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower() in NAMED_FUNCTIONS
    if isinstance(node, exp.Func):
        return isinstance(node, FUNCTIONS)
    return True
