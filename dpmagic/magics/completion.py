"""Tab completion inside ``%%dpsql`` cells, from the gate's public schema.

An IPython matcher, so JupyterLab, classic Notebook, VS Code and the IPython
terminal all offer it: the kernel answers ``complete_request`` and every front
end shows the answer. It offers table and column names (from ``GET
/v1/schema``, which is public policy, never data), the SQL keywords and
functions the gate answers, and the magic's options on its first line. In a
``%%dpsql`` cell Python's own completions are suppressed: they would offer
Python names inside SQL.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from IPython.core.completer import (
    CompletionContext,
    SimpleCompletion,
    SimpleMatcherResult,
    context_matcher,
)

# What the gate's pipeline accepts (docs/sql.md).
KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "OFFSET", "AS",
    "AND", "OR", "NOT", "IN", "BETWEEN", "IS NULL", "IS NOT NULL", "LIKE", "CASE", "WHEN",
    "THEN", "ELSE", "END", "JOIN", "LEFT JOIN", "CROSS JOIN", "ON", "USING", "WITH",
    "DISTINCT", "ASC", "DESC", "EXISTS", "FILTER", "WITHIN GROUP",
)  # fmt: skip
FUNCTIONS = (
    "COUNT", "SUM", "AVG", "MIN", "MAX", "MEDIAN", "QUANTILE_CONT", "QUANTILE_DISC",
    "QUANTILE", "PERCENTILE_CONT", "PERCENTILE_DISC", "VAR_POP", "VAR_SAMP", "VARIANCE",
    "STDDEV_POP", "STDDEV_SAMP", "STDDEV", "ABS", "ROUND", "FLOOR", "CEIL", "SQRT",
    "COALESCE", "NULLIF", "LEAST", "GREATEST", "TRY_CAST", "IF", "UPPER", "LOWER", "TRIM",
    "SUBSTRING", "SUBSTR", "LEFT", "RIGHT", "LENGTH", "CONCAT", "YEAR", "MONTH", "QUARTER",
    "DAYOFWEEK", "EXTRACT",
)  # fmt: skip
CELL_MAGIC = re.compile(r"\s*%%dpsql\b")
LINE_MAGIC = re.compile(r"\s*%dpsql\b")
# The word before the token that says a table name comes next.
TABLE_CONTEXT = re.compile(r"\b(FROM|JOIN)\s*$", re.IGNORECASE)
# `FROM visits AS v`, `JOIN patients p`: an alias for a table.
ALIAS = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)(?:\s+(?:AS\s+)?(\w+))?", re.IGNORECASE)
ALIAS_STOP = {"WHERE", "GROUP", "ORDER", "JOIN", "LEFT", "ON", "USING", "CROSS", "LIMIT"}


@dataclass
class Sources:
    """Where completions come from: the magic supplies each lazily."""

    schema: Callable[[], dict[str, Any] | None]
    """The public schema of the current dataset, or None without a gate."""
    options: Callable[[], Iterable[str]]
    snippets: Callable[[], Iterable[str]]


def make_matcher(sources: Sources) -> Callable[[CompletionContext], SimpleMatcherResult]:
    """An IPython context matcher for ``%%dpsql`` cells and ``%dpsql`` lines."""

    @context_matcher()
    def dpsql_matcher(context: CompletionContext) -> SimpleMatcherResult:
        before = context.full_text[: _offset(context)]
        token = context.token
        whole = context.full_text
        if CELL_MAGIC.match(before):
            first_line = "\n" not in before
            if first_line:
                found = _option_completions(before, token, sources)
            else:
                found = _sql_completions(before, token, sources, whole)
        elif LINE_MAGIC.match(context.line_with_cursor) and "\n" not in before:
            if token.startswith("-"):
                found = _option_completions(before, token, sources)
            else:
                found = _sql_completions(before, token, sources, whole)
        else:
            return {"completions": [], "suppress": False}
        return {"completions": found, "suppress": True}

    return dpsql_matcher


def sql_completions(
    text_before_token: str, token: str, schema: dict[str, Any] | None, whole: str = ""
) -> list[SimpleCompletion]:
    """What may follow ``text_before_token`` when the word being typed is ``token``;
    ``whole`` is the whole cell, whose FROM and JOIN clauses name the tables in use."""
    tables = (schema or {}).get("tables") or {}
    if TABLE_CONTEXT.search(text_before_token):
        return _matching(token, tables, "table")
    aliases = _aliases(whole or text_before_token, tables)
    if "." in token:
        alias, _, part = token.rpartition(".")
        table = aliases.get(alias, alias if alias in tables else None)
        of_table = (tables.get(table) or {}).get("columns") or {}
        return [
            SimpleCompletion(f"{alias}.{c.text}", type="column")
            for c in _matching(part, of_table, "column")
        ]
    named = {t for t in aliases.values() if t in tables}
    columns: dict[str, None] = {}
    for name, info in tables.items():
        if not named or name in named:
            columns.update(dict.fromkeys(info.get("columns") or {}))
    return (
        _matching(token, columns, "column")
        + _matching(token, FUNCTIONS, "function")
        + _matching(token, KEYWORDS, "keyword")
        + _matching(token, tables, "table")
    )


def _sql_completions(
    before: str, token: str, sources: Sources, whole: str
) -> list[SimpleCompletion]:
    text = before[: len(before) - len(token)] if token else before
    return sql_completions(text, token, _safe(sources.schema), whole)


def _option_completions(before: str, token: str, sources: Sources) -> list[SimpleCompletion]:
    previous = before[: len(before) - len(token)].split()
    last = previous[-1] if previous else ""
    if last in ("--with", "--save"):
        return _matching(token, sources.snippets(), "snippet")
    if last == "--dataset":
        schema = _safe(sources.schema) or {}
        return _matching(token, schema.get("datasets") or [], "dataset")
    return _matching(token, sources.options(), "option")


def _aliases(text: str, tables: dict[str, Any]) -> dict[str, str]:
    """Alias → table for the tables named after FROM and JOIN (a table is its own alias)."""
    found: dict[str, str] = {}
    for match in ALIAS.finditer(text):
        table, alias = match.group(1), match.group(2)
        found[table] = table
        if alias and alias.upper() not in ALIAS_STOP:
            found[alias] = table
    return found


def _matching(token: str, names: Iterable[str], kind: str) -> list[SimpleCompletion]:
    """Names that start with ``token`` (ignoring case), in the case the user types."""
    lower = token.lower()
    out = []
    for name in names:
        if not name.lower().startswith(lower):
            continue
        if kind in ("keyword", "function") and token and token == token.lower():
            name = name.lower()
        out.append(SimpleCompletion(name, type=kind))
    return out


def _offset(context: CompletionContext) -> int:
    """The cursor's offset in the whole cell, from its line and column."""
    lines = context.full_text.split("\n")
    return sum(len(line) + 1 for line in lines[: context.cursor_line]) + context.cursor_position


def _safe(get: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """Completion must never fail a keystroke: no schema is just fewer names."""
    try:
        return get()
    except Exception:
        return None
