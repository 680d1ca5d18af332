"""The utility preview in ``%dpbudget``: per kind of query, how to ask for it, its 95%
half-width, what each costs and how many more the budget left allows, from the typed
``preview`` of ``GET /v1/budget?preview=true`` (docs/http-api.md). Every number is the
gate's, shown as it came (rounded for reading); nothing here decides or computes one,
and every string came over the wire, so the HTML and Markdown escape it."""

from __future__ import annotations

from html import escape
from typing import Any

import pandas as pd

from dpmagic.display.render import amount, budget_number, format_exact, markdown_table, table

HEADERS = ("query", "ask with", "± at {level}", "cost each", "more that fit")
BASES = ("at_accuracy", "at_default")


def preview_note(preview: dict[str, Any] | None) -> str:
    """What the table says, in one line (whose budget, at what level, over what rows),
    or why there is none."""
    if preview is None:
        return "no preview: these answers come from a transcript, and only a gate can plan one"
    if not preview.get("kinds"):
        return "nothing to preview: no private table to count, no bounded column to average"
    over = _rows_note(preview.get("rows"), preview.get("rows_basis"))
    return (
        "what the budget left allows (the least left in any budget this notebook draws on), "
        f"planned by the gate without charging anything{over}"
    )


def _rows_note(rows: Any, basis: Any) -> str:
    """What a mean's ± is over: the rows asked for (``--rows``), or the gate's default,
    said to be an assumption (the data's size is private, and the gate does not use
    it); an older gate that does not say which reads as the assumption it was."""
    if not isinstance(rows, int):
        return ""
    if basis == "asked":
        return f"; a mean's ± is over a group of {rows:,} rows, as asked"
    return (
        f"; a mean's ± assumes a group of {rows:,} rows (the data's size is private: "
        "give yours with --rows N)"
    )


def preview_rows(preview: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The table's headers, and per way to ask for a kind its query's SQL (for a
    tooltip) and its cells: at the accuracy asked for (when one was), then at the
    dataset's default ε."""
    level = _level(preview.get("alpha"))
    headers = [h.format(level=level) for h in HEADERS]
    rows = []
    for kind in preview.get("kinds") or []:
        for basis in BASES:
            option = kind.get(basis)
            if option is None:
                continue
            cells = [_label(kind), *_option_cells(basis, option, preview)]
            rows.append((str(kind.get("sql", "")), cells))
    return headers, rows


def preview_html(preview: dict[str, Any] | None) -> str:
    headers, rows = preview_rows(preview or {})
    body = [
        [f'<td title="{escape(sql)}" style="text-align: left">{escape(label)}</td>']
        + [f"<td>{escape(cell)}</td>" for cell in cells]
        for sql, (label, *cells) in rows
    ]
    return table(headers, body, raw=True) if body else ""


def preview_markdown(preview: dict[str, Any] | None) -> str:
    headers, rows = preview_rows(preview or {})
    return markdown_table(headers, [cells for _, cells in rows]) if rows else ""


def preview_text(preview: dict[str, Any] | None) -> str:
    headers, rows = preview_rows(preview or {})
    if not rows:
        return ""
    return pd.DataFrame([cells for _, cells in rows], columns=headers).to_string(index=False)


def _label(kind: dict[str, Any]) -> str:
    """``count of patients``, ``mean of visits.cost``: the kind in words from its fields."""
    if kind.get("kind") == "mean":
        return f"mean of {kind.get('table')}.{kind.get('column')}"
    return f"{kind.get('kind')} of {kind.get('table')}"


def _option_cells(basis: str, option: dict[str, Any], preview: dict[str, Any]) -> list[str]:
    """How to ask, the ± its plan states, the cost of each and how many fit; a way the
    gate would refuse shows its reason instead."""
    if "refused" in option:
        accuracy = preview.get("accuracy")
        wanted = "default ε" if basis == "at_default" else f"±{format_exact(accuracy)}"
        return [wanted, f"refused: {option['refused']}", "", ""]
    return [
        _ask(option.get("ask") or {}, default=basis == "at_default"),
        f"±{budget_number(float(option.get('half_width') or 0.0), up=True)}",
        amount(option.get("cost") or {}),
        f"{int(option.get('fits') or 0):,}",
    ]


def _ask(ask: dict[str, Any], default: bool) -> str:
    """The ``%%dpsql`` options that ask for it: ``--accuracy A``, or ``-e ε`` (``-d δ``
    where δ is in play); the default ε needs none, and says so."""
    if "accuracy" in ask:
        return f"--accuracy {format_exact(ask['accuracy'])}"
    text = f"-e {format_exact(ask.get('epsilon'))}"
    if ask.get("delta"):
        text += f" -d {format_exact(ask['delta'])}"
    return f"{text} (the default)" if default else text


def _level(alpha: Any) -> str:
    """``95%`` for an alpha of 0.05."""
    if not isinstance(alpha, int | float):
        return "the gate's level"
    return f"{format_exact(round(100 * (1 - alpha), 6))}%"
