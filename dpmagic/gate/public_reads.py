"""Public tables read plainly, where the owner allows it (``public_tables_readable``).

A query that reads only the dataset's public tables (a list of regions, a price list)
releases nothing about any person: its answer is a function of public contents. Where
the owner says so, such a query is answered exactly and free: no noise, no charge, no
ledger entry, no padding (its time depends on public contents alone). The gate still
decides what runs, twice:

1. **On the tree** (``vet``): one ``SELECT`` whose every table is a declared public
   table (CTEs and subqueries over them included; no catalog, schema or file), every
   node of a kind on the allow-list below (the checker's operators and total
   functions, text functions, the aggregates, the clauses of a ``SELECT``). A private
   table anywhere, a table function or any other node sends the query down the usual
   path, where it is planned with noise or refused.
2. **In the engine**, rendered in its dialect from the vetted tree: on DuckDB
   (``Database.read_public``) the same walk of DuckDB's own parse as every generated
   query's (``_walk``), with the public tables as the only tables; on Spark
   (``SparkDatabase.read_public``) its guard, with the public tables as the only
   tables and the functions this allow-list names. Under the gate's time limit, at
   most ``public_row_limit`` rows fetched; the reply says when it cut.
"""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.engines.interface import PublicRead
from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import Dataset
from dpmagic.gate.sql.aggregates.registry import CATALOGUE
from dpmagic.gate.sql.check import (
    CONCATENATION,
    DATE_PARTS,
    SCALAR_NODES,
    TEXT_FUNCTIONS,
)
from dpmagic.gate.sql.parse import parse

# The parts of a SELECT a public read may have, beside the checker's operators.
CLAUSES: tuple[type[exp.Expression], ...] = (
    exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order,
    exp.Ordered, exp.Limit, exp.Offset, exp.Subquery, exp.With, exp.CTE, exp.Alias,
    exp.TableAlias, exp.Table, exp.Column, exp.Identifier, exp.Star, exp.Distinct,
    exp.Like, exp.ILike, exp.Extract, exp.Var, exp.Exists, exp.Tuple, exp.Count,
    exp.Values,
)  # fmt: skip
# The catalogue's node types; a function it registers by name (DuckDB has none of them)
# is not read exactly.
NODES = tuple(k for k in CATALOGUE if isinstance(k, type))
ALLOWED = (*CLAUSES, *SCALAR_NODES, *DATE_PARTS, *TEXT_FUNCTIONS, *CONCATENATION, *NODES)


def public_read(sql: str, params: dict, dataset: Dataset) -> PublicRead | None:
    """The query as a public read, or None where it reads a private table or anything
    the allow-list does not name (it then goes the usual way). Refused where it reads
    public tables only but the owner has not made them readable, saying how."""
    tree = parse(sql, params).tree
    if not _public_only(tree, dataset):
        return None
    if not dataset.public_tables_readable:
        raise Refused(
            "the query reads only public tables, which this dataset does not serve "
            "plainly: the owner can allow it with public_tables_readable = true"
        )
    return PublicRead(tree, dataset.public_row_limit, ALLOWED)


def released_read(tree: exp.Select, dataset: Dataset, public: tuple[str, ...]) -> PublicRead:
    """The rest of a query whose private reads were all released first
    (``sql/released_tables.py``), as a plain read over the released rows and the
    public tables ``public``: vetted as any public read is, and refused where it
    names a public table the owner has not made readable, or uses what a plain read
    does not allow."""
    if public and not dataset.public_tables_readable:
        raise Refused(
            f"after its releases the query reads the public table {public[0]}, which this "
            "dataset does not serve plainly: the owner can allow it with "
            "public_tables_readable = true"
        )
    if not _public_only(tree, dataset):
        raise Refused(
            "after its releases the query uses what a plain read does not allow (a "
            "window, a table function): select, filter, join, group, order"
        )
    return PublicRead(tree, dataset.public_row_limit, ALLOWED)


def _public_only(tree: exp.Select, dataset: Dataset) -> bool:
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    tables = list(tree.find_all(exp.Table))
    if not tables:
        return False
    for table in tables:
        if not isinstance(table.this, exp.Identifier):
            return False  # a table function
        if table.args.get("catalog") or table.args.get("db"):
            return False
        name = table.name.lower()
        declared = dataset.table(name)
        if name in ctes and declared is None:
            continue
        if declared is None or not declared.public:
            return False
    return all(isinstance(node, ALLOWED) for node in tree.walk())
