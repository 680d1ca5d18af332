"""``{{name}}`` in a ``%%dpsql`` cell: JupySQL's spelling, dpmagic's binding.

JupySQL renders ``{{name}}`` with Jinja, splicing the value into the SQL
text. dpmagic never does that: each ``{{name}}`` becomes the parameter
``$name``, whose value the gate binds as a typed literal after parsing, so a
value can never change the shape of the query. What templating could do
beyond naming a value (blocks, filters, expressions, a value inside a longer
string) is refused with the way to write it instead.
"""

from __future__ import annotations

import re

from IPython.core.error import UsageError

# A single-quoted string or a double-quoted identifier, with doubled quotes inside.
QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
WHOLE_STRING = re.compile(r"'\{\{\s*([A-Za-z_]\w*)\s*\}\}'")
NAME = re.compile(r"\s*([A-Za-z_]\w*)\s*")
BLOCK = re.compile(r"\{%|\{#")


def bind_templates(sql: str) -> tuple[str, set[str]]:
    """``{{name}}`` → ``$name``; returns the SQL and the names written as ``'{{name}}'``.

    A whole string literal ``'{{name}}'`` is the parameter itself (its value
    must then be a string); ``{{`` anywhere else inside quotes is refused.
    """
    out: list[str] = []
    quoted: set[str] = set()
    at = 0
    for literal in QUOTED.finditer(sql):
        out.append(_outside(sql[at : literal.start()]))
        text = literal.group()
        whole = WHOLE_STRING.fullmatch(text)
        if whole:
            quoted.add(whole.group(1))
            out.append(f"${whole.group(1)}")
        elif "{{" in text:
            raise UsageError(
                "{{…}} inside a quoted string or identifier cannot be bound as a value: "
                "build the whole string in Python (e.g. pattern = f'%{x}%') and write {{pattern}}"
            )
        else:
            out.append(text)
        at = literal.end()
    out.append(_outside(sql[at:]))
    return "".join(out), quoted


def _outside(text: str) -> str:
    """Templates in SQL outside any quotes."""
    if BLOCK.search(text):
        raise UsageError(
            "Jinja blocks ({% … %}, {# … #}) are not supported: dpmagic binds values, "
            "it does not build SQL text"
        )

    def name(match: re.Match[str]) -> str:
        inner = NAME.fullmatch(match.group(1))
        if inner is None:
            raise UsageError(
                f"{{{{{match.group(1).strip()}}}}} is not a variable name: compute the value "
                "in Python first and write {{name}}"
            )
        return f"${inner.group(1)}"

    return TEMPLATE.sub(name, text)
