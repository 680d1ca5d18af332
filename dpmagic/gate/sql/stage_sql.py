"""The SQL pieces every release inside a query shares (``staged.py``, values released
before the query's own release; ``released_tables.py``, releases the rest of a query
only post-processes): which subqueries are read as values, a stage's query with the
CTEs it reads, and released cells and values written back as literals. Below both,
so that neither imports the other for them.
"""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.sql.parse import DIALECT

WITH = "with_" if "with_" in exp.Select.arg_types else "with"
# The most subqueries one query may release before its own release.
MAX_STAGES = 8


def is_value(node: exp.Subquery) -> bool:
    """A subquery read as a value: not a table of ``FROM``/``JOIN``, not the set of an
    ``IN`` or the rows of an ``EXISTS``, ``ANY`` or ``ALL``."""
    parent = node.parent
    if isinstance(parent, exp.Subquery):  # ((SELECT …)): the outer one is the value
        return False
    if isinstance(parent, exp.From | exp.Join | exp.Exists | exp.Any | exp.All | exp.Lateral):
        return False
    if isinstance(parent, exp.In) and parent.args.get("query") is node:
        return False
    return not isinstance(parent, exp.Union)


def with_needed(select: exp.Select, ctes: dict[str, exp.CTE]) -> str:
    """``select`` as a query of its own, with the query's CTEs it reads (and those they
    read), in the order the query defines them."""
    stage = select.copy()
    needed: list[str] = []
    todo = [t.name.lower() for t in stage.find_all(exp.Table)]
    while todo:
        name = todo.pop()
        if name in ctes and name not in needed:
            needed.append(name)
            todo += [t.name.lower() for t in ctes[name].this.find_all(exp.Table)]
    if needed:
        order = [n for n in ctes if n in needed]
        stage.set(WITH, exp.With(expressions=[ctes[n].copy() for n in order]))
    return stage.sql(dialect=DIALECT)


def cell(value: object) -> exp.Expression:
    """A released cell as a literal: numbers, text, truth values, NULL; a float with an
    exponent, so that it is a DOUBLE, not a DECIMAL."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        return exp.Literal.number(f"{value:.17e}")
    return exp.Literal.string(str(value))


def literal_value(value: float | None) -> exp.Expression:
    """A released value as a number literal of one shape whatever the value (``repr`` of
    a float), or NULL."""
    if value is None:
        return exp.Null()
    return exp.Literal.number(repr(float(value)))
