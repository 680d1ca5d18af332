"""Pass 2: names against the public schema.

Qualifies every column with the one table it can come from and refuses any
name the policy does not declare. Only the policy is consulted, so a refusal
here says nothing about the data.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.errors import Refused
from dpmagic.gate.policy import Column, Dataset, Table
from dpmagic.gate.sql.parse import DIALECT, Parsed

# sqlglot 30 names these arguments with a trailing underscore.
FROM = "from_" if "from_" in exp.Select.arg_types else "from"
WITH = "with_" if "with_" in exp.Select.arg_types else "with"


@dataclass(frozen=True)
class Resolved:
    """The SELECT with every column reference bound to a declared column."""

    tree: exp.Select
    canonical: str
    dataset: Dataset
    table: Table
    columns: dict[int, Column]  # id(exp.Column node) -> declared column


def resolve(parsed: Parsed, dataset: Dataset) -> Resolved:
    tree = parsed.tree
    if tree.args.get(WITH):
        raise Refused("WITH (common table expressions) is not supported yet")
    if tree.args.get("joins"):
        raise Refused("joins are not supported yet: query one table")
    source = tree.args.get(FROM)
    if source is None:
        raise Refused("the query has no FROM clause")
    table_node = source.this
    if not isinstance(table_node, exp.Table) or not isinstance(table_node.this, exp.Identifier):
        raise Refused(f"FROM must name a declared table, not {_describe(table_node)}")
    if table_node.this.quoted and ("/" in table_node.name or "." in table_node.name):
        raise Refused("reading files is not allowed: FROM must name a declared table")
    if table_node.args.get("catalog") or (
        table_node.args.get("db") and table_node.text("db").lower() != "main"
    ):
        raise Refused(f"unknown table {table_node.sql(dialect=DIALECT)!r}")
    table = dataset.table(table_node.name)
    if table is None:
        raise Refused(
            f"unknown table {table_node.name!r}; declared: {', '.join(sorted(dataset.tables))}"
        )
    if table.public:
        raise Refused(f"table {table.name!r} is public: query it without the gate")
    if table_node.args.get("sample") or tree.find(exp.TableSample):
        raise Refused("sampling clauses (USING SAMPLE, TABLESAMPLE) are not allowed")
    names = {table.name}
    if table_node.alias:
        names = {table_node.alias.lower()}

    columns: dict[int, Column] = {}
    for node in tree.find_all(exp.Column):
        if isinstance(node.this, exp.Star):
            raise Refused("SELECT * would release rows: select aggregates instead")
        qualifier = node.table.lower()
        if qualifier and qualifier not in names:
            raise Refused(f"unknown table or alias {node.table!r} in {node.sql(dialect=DIALECT)}")
        column = table.columns.get(node.name.lower())
        if column is None:
            if _is_select_alias(tree, node):
                continue
            raise Refused(
                f"unknown column {node.name!r} in table {table.name!r}; declared: "
                + ", ".join(sorted(table.columns))
            )
        node.set("table", None)
        node.set("this", exp.to_identifier(column.name))
        columns[id(node)] = column
    return Resolved(
        tree=tree, canonical=parsed.canonical, dataset=dataset, table=table, columns=columns
    )


def _is_select_alias(tree: exp.Select, node: exp.Column) -> bool:
    """ORDER BY, HAVING and GROUP BY may name an output alias (``ORDER BY n``)."""
    if node.table:
        return False
    in_post = node.find_ancestor(exp.Order, exp.Having, exp.Group) is not None
    aliases = {e.alias.lower() for e in tree.expressions if e.alias}
    return in_post and node.name.lower() in aliases


def _describe(node: exp.Expression | None) -> str:
    if isinstance(node, exp.Subquery):
        return "a subquery (not supported yet)"
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Func):
        return f"the table function {node.this.sql(dialect=DIALECT).split('(')[0]}()"
    return "that" if node is None else node.sql(dialect=DIALECT)[:60]
