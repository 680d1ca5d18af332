"""Pass 1: text to one SELECT tree, in the grammar the later passes read.

Only a single ``SELECT`` is accepted; every other statement (``ATTACH``,
``COPY``, ``SET``, ``PRAGMA``, ``SUMMARIZE``, ...) and every second statement
is refused here, before any name is looked at. Parameters (``$name``) are
bound as typed literal nodes in the tree, never spliced into text. Then the
rules of ``sql/normalize/`` rewrite what analysts write (a date ± an interval,
column names after an alias, a condition repeated in each branch of an ``OR``)
into forms the later passes already read.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError

from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.normalize import normalize

# sqlglot's DuckDB dialect, one instance for every parse and rendering: named by its
# string, each call built a new one (a tenth of the analysis's calls into sqlglot).
DIALECT = Dialect.get_or_raise("duckdb")
MAX_SQL_CHARS = 20_000
# Aggregates the gate answers that sqlglot has no node for. sqlglot is compiled, so no
# node class can be added: a call of one is read as sqlglot's ``AnonymousAggFunc``
# (an aggregate to every pass, written back as it was), and the catalogue registers
# it by name (``aggregates.registry``, which checks the two lists agree).
NAMED_AGGREGATES = frozenset({"TRIMMED_MEAN"})

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
    except ParseError as exc:
        raise Refused(f"could not parse the query: {_parse_error(exc)}") from None
    except TokenError:
        raise Refused(
            "could not parse the query: a quote or comment is not closed (text is written "
            "between single quotes, names between double quotes)"
        ) from None
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
    tree = _named_aggregates(tree)
    for node in tree.walk():  # comments are the user's text: none is carried on
        node.comments = None
    tree = normalize(tree)
    return Parsed(tree=tree, canonical=tree.sql(dialect=DIALECT, normalize=True))


def _named_aggregates(tree: exp.Select) -> exp.Select:
    """Each call of a ``NAMED_AGGREGATES`` function, which sqlglot reads as an unknown
    scalar function, made the aggregate it is."""

    def named(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Anonymous) and node.name.upper() in NAMED_AGGREGATES:
            args = [a.copy() for a in node.expressions]
            return exp.AnonymousAggFunc(this=node.name.upper(), expressions=args)
        return node

    found = tree.transform(named, copy=False)  # the parser's tree, no one else's
    if not isinstance(found, exp.Select):  # only a call is replaced, never the root
        raise RuntimeError("internal error: reading named aggregates replaced the statement")
    return found


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

    bound = tree.transform(replace, copy=False)  # the parser's tree, no one else's
    if not isinstance(bound, exp.Select):  # only a placeholder is replaced, never the root
        raise RuntimeError("internal error: binding the parameters replaced the statement")
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


def _statement_name(tree: exp.Expr, sql: str) -> str:
    if isinstance(tree, exp.Command):
        return tree.name.upper() or sql.split()[0].upper()
    return sql.split()[0].upper() if sql.split() else type(tree).__name__.upper()


# sqlglot names a node by its class in some messages ("Required keyword: 'expression'
# missing for <class 'sqlglot.expressions.core.And'>"): a user wrote SQL, not Python.
_MISSING = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]+\.(\w+)'>")
_CLASS = re.compile(r"<class '[\w.]+\.(\w+)'>")


def _parse_error(exc: ParseError) -> str:
    """sqlglot's first error in the user's terms: what is wrong, where (line, column
    and the words there), never a token's or a class's Python representation."""
    errors = getattr(exc, "errors", None) or []
    if not errors:
        return _CLASS.sub(r"\1", str(exc).strip().splitlines()[0])[:200]
    first = errors[0]
    description = str(first.get("description") or "unexpected text")
    missing = _MISSING.fullmatch(description)
    if missing:
        part, node = missing.groups()
        name = "a parenthesis" if node == "Paren" else node.upper()
        description = f"{name} has nothing " + ("after it" if part == "expression" else "in it")
    description = _CLASS.sub(r"\1", description)
    near = str(first.get("highlight") or "").strip()
    where = f"line {first.get('line', 1)}, column {first.get('col', 1)}"
    return (f"{description} at {where}" + (f", near {near[:40]!r}" if near else ""))[:200]
