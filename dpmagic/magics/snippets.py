"""Saved queries, JupySQL's ``--save NAME`` and ``--with NAME``, as CTEs.

A snippet is a piece of SQL kept under a name, usually a row filter or a
derived column that the gate would not answer alone (``SELECT * FROM visits
WHERE cost > 100``). ``--with NAME`` puts it in front of a later query as
``WITH NAME AS (…)``, with the snippets it was itself built ``--with``
first, so the gate receives one SQL text and analyses it whole: a snippet
is never a way around the gate's checks, and saving one runs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from IPython.core.error import UsageError

LEADING_WITH = re.compile(r"^\s*WITH\s+(?!RECURSIVE\b)", re.IGNORECASE)


@dataclass(frozen=True)
class Snippet:
    sql: str
    uses: tuple[str, ...]


class Snippets:
    """The snippets of one kernel, in the order they were saved."""

    def __init__(self) -> None:
        self._saved: dict[str, Snippet] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self._saved)

    def save(self, name: str, sql: str, uses: list[str]) -> None:
        """Keep ``sql`` as ``name``, built on the snippets ``uses``."""
        for used in uses:
            self._known(used)
        if name in self._closure(uses):
            raise UsageError(f"snippet {name} cannot be built --with itself")
        self._saved[name] = Snippet(sql.strip().rstrip(";"), tuple(uses))

    def compose(self, sql: str, uses: list[str]) -> str:
        """``sql`` with the snippets it uses (and theirs, first) as CTEs in front."""
        if not uses:
            return sql
        ctes = ",\n".join(f"{n} AS (\n{self._saved[n].sql}\n)" for n in self._closure(uses))
        rest = LEADING_WITH.match(sql)
        if rest:
            return f"WITH {ctes},\n{sql[rest.end() :]}"
        return f"WITH {ctes}\n{sql.lstrip()}"

    def _closure(self, uses: list[str] | tuple[str, ...]) -> list[str]:
        """The snippets ``uses`` needs, each after those it is built on, once."""
        order: list[str] = []

        def visit(name: str) -> None:
            snippet = self._known(name)
            for used in snippet.uses:
                visit(used)
            if name not in order:
                order.append(name)

        for name in uses:
            visit(name)
        return order

    def _known(self, name: str) -> Snippet:
        if name not in self._saved:
            saved = ", ".join(self._saved) or "none yet"
            raise UsageError(f"no snippet {name}; saved: {saved} (save one with --save {name})")
        return self._saved[name]
