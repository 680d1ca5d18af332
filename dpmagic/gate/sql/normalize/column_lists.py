"""Rule: the column names after a subquery's alias or a CTE's name, moved inside it.

``(SELECT c_custkey, COUNT(o_orderkey) FROM …) AS c_orders (c_custkey, c_count)``
and ``WITH revenue0 (supplier_no, total_revenue) AS (SELECT …)`` (TPC-H's queries
13 and 15) name the derived table's columns after it. SQL renames the first ``k``
output columns, in order, to the ``k`` names; the rule writes each name as that
column's alias in the SELECT, which is what the resolver reads. More names than
columns is an error in SQL, refused here with SQL's words; a SELECT with ``*`` has
columns the rule cannot count from the text alone, so it is left for the resolver
(which refuses a list after an alias it cannot place).
"""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.failures import Refused


def inline_column_lists(tree: exp.Select) -> exp.Select:
    """Every subquery and CTE in ``tree`` with a column list, named inside instead."""
    for node in list(tree.find_all(exp.Subquery, exp.CTE)):
        alias = node.args.get("alias")
        select = node.this
        if not isinstance(alias, exp.TableAlias) or not alias.columns:
            continue
        if not isinstance(select, exp.Select) or any(
            isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)
            for e in select.expressions
        ):
            continue
        names = list(alias.columns)
        if len(names) > len(select.expressions):
            raise Refused(
                f"{alias.name or 'a subquery'} names {len(names)} columns but its SELECT has "
                f"{len(select.expressions)}"
            )
        for i, name in enumerate(names):
            expression = select.expressions[i]
            inner = expression.this if isinstance(expression, exp.Alias) else expression
            if isinstance(inner, exp.Column) and inner.name == name.name:
                expression.replace(inner.copy())  # already so named
            else:
                expression.replace(exp.alias_(inner.copy(), name.copy()))
        alias.set("columns", None)
    return tree
