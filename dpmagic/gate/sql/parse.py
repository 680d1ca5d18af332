"""Pass 1: text to one SELECT tree.

Only a single ``SELECT`` is accepted; every other statement (``ATTACH``,
``COPY``, ``SET``, ``PRAGMA``, ``SUMMARIZE``, ...) and every second statement
is refused here, before any name is looked at. Parameters (``$name``) are
bound as typed literal nodes in the tree, never spliced into text.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpmagic.gate.failures import Refused

DIALECT = "duckdb"
MAX_SQL_CHARS = 20_000

# sqlglot warns on stderr (with the statement's text) when it falls back to a
# raw Command; the refusal below says all the user needs.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

Param = int | float | str | bool | None


@dataclass(frozen=True)
class Parsed:
    """One SELECT statement with its parameters bound."""

    tree: exp.Select
    canonical: str  # normalised SQL, the identity of the query for replay


def parse(sql: str, params: dict[str, Param] | None = None) -> Parsed:
    if not isinstance(sql, str) or not sql.strip():
        raise Refused("the query is empty")
    if len(sql) > MAX_SQL_CHARS:
        raise Refused(f"the query is longer than {MAX_SQL_CHARS} characters")
    try:
        statements = [s for s in sqlglot.parse(sql, dialect=DIALECT) if s is not None]
    except (ParseError, TokenError) as exc:
        raise Refused(f"could not parse the query: {_first_line(exc)}") from None
    if not statements:
        raise Refused("the query is empty")
    if len(statements) > 1:
        raise Refused("only one statement is allowed; remove everything after the first ';'")
    tree = statements[0]
    if isinstance(tree, exp.SetOperation):
        raise Refused(
            f"{_set_operation(tree)} is not supported: set operations (UNION, INTERSECT, "
            "EXCEPT) are refused; ask each SELECT as a query of its own, or combine the parts "
            "in one SELECT (a WHERE with OR, or a CASE key with GROUP BY)"
        )
    if not isinstance(tree, exp.Select):
        raise Refused(f"only SELECT queries are allowed, not {_statement_name(tree, sql)}")
    tree = _bind(tree, params or {})
    for node in tree.walk():  # comments are the user's text: none is carried on
        node.comments = None
    return Parsed(tree=tree, canonical=tree.sql(dialect=DIALECT, normalize=True))


def _bind(tree: exp.Select, params: dict[str, Param]) -> exp.Select:
    if not isinstance(params, dict):
        raise Refused("params must be an object of name → value")
    used: set[str] = set()

    def replace(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Placeholder):
            return node
        name = node.name
        if not name:
            raise Refused("use named parameters such as $age, not '?'")
        if name not in params:
            raise Refused(f"parameter ${name} has no value")
        used.add(name)
        return _literal(name, params[name])

    bound = tree.transform(replace)
    unused = sorted(set(params) - used)
    if unused:
        raise Refused(f"parameter {unused[0]!r} is not used in the query")
    return bound


def _literal(name: str, value: Param) -> exp.Expression:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Refused(f"parameter ${name} must be a finite number")
        return exp.Literal.number(repr(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    raise Refused(f"parameter ${name} must be a number, a string, a boolean or null")


def _set_operation(tree: exp.SetOperation) -> str:
    """The operation as written: ``UNION ALL``, ``EXCEPT``, ``UNION BY NAME``, …"""
    name = {exp.Union: "UNION", exp.Intersect: "INTERSECT", exp.Except: "EXCEPT"}.get(
        type(tree), type(tree).__name__.upper()
    )
    if tree.args.get("distinct") is False:
        name += " ALL"
    if tree.args.get("by_name"):
        name += " BY NAME"
    return name


def _statement_name(tree: exp.Expression, sql: str) -> str:
    if isinstance(tree, exp.Command):
        return tree.name.upper() or sql.split()[0].upper()
    return sql.split()[0].upper() if sql.split() else type(tree).__name__.upper()


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:200]
