"""What the notebook shows for a gate reply: answers, their accuracy, their cost.

A noisy number is only useful next to how noisy it is and what it cost, so
the rendering puts each cell's 95% interval in a tooltip and closes with a
footer of the ε spent and left. Every string here came over the wire, so
everything is HTML-escaped; colours are inherited from the front end's theme
(JupyterLab's CSS variables, with plain fallbacks) so dark mode just works.
"""

from __future__ import annotations

import math
from functools import cached_property
from html import escape
from typing import Any

import pandas as pd

MUTED = "color: var(--jp-ui-font-color2, inherit); opacity: 0.85; font-size: 0.9em"
NOISY_CELL = "cursor: help; text-decoration: underline dotted"


class DPResult:
    """One reply to ``POST /v1/query``: noisy rows plus their cost and accuracy."""

    def __init__(self, reply: dict[str, Any], display_limit: int | None = None) -> None:
        self.reply = reply
        self.dataset: str = reply.get("dataset", "")
        self.columns: list[str] = list(reply.get("columns", []))
        self.rows: list[list[Any]] = [list(r) for r in reply.get("rows", [])]
        self.cost: dict[str, float] = reply.get("cost", {"epsilon": 0.0, "delta": 0.0})
        self.accuracy: dict[str, Any] = reply.get("accuracy", {"alpha": 0.05, "columns": []})
        self.budget: dict[str, Any] = reply.get("budget", {})
        self.replayed: bool = bool(reply.get("replayed", False))
        self.dry_run: bool = bool(reply.get("dry_run", False))
        self.plan: list[dict[str, Any]] = list(reply.get("plan", []))
        self.display_limit = display_limit
        """Rows shown by the HTML and text views; ``None`` or 0 shows all."""

    @cached_property
    def df(self) -> pd.DataFrame:
        """The noisy answer as a DataFrame, one column per output column."""
        return pd.DataFrame(self.rows, columns=self.columns)

    @property
    def confidence(self) -> float:
        """The coverage of the reported intervals, e.g. 0.95."""
        return 1.0 - float(self.accuracy.get("alpha", 0.05))

    def interval(self, column: str) -> pd.DataFrame:
        """Each row's interval for ``column`` as a DataFrame of ``lo`` and ``hi``."""
        if column not in self.columns:
            raise KeyError(f"no column {column!r}; columns are {self.columns}")
        info = self._column_accuracy(self.columns.index(column))
        if info is None:
            raise ValueError(f"column {column!r} is a group key: it carries no noise")
        pairs = [(lo, hi) for lo, hi in info["intervals"]]
        return pd.DataFrame(pairs, columns=["lo", "hi"], index=self.df.index)

    def _column_accuracy(self, index: int) -> dict[str, Any] | None:
        columns = self.accuracy.get("columns") or []
        return columns[index] if index < len(columns) else None

    def _interval_at(self, column: int, row: int) -> tuple[Any, Any] | None:
        info = self._column_accuracy(column)
        intervals = (info or {}).get("intervals") or []
        pair = intervals[row] if row < len(intervals) else None
        return (pair[0], pair[1]) if pair else None

    def _shown_rows(self) -> list[int]:
        limit = self.display_limit or len(self.rows)
        return list(range(min(limit, len(self.rows))))

    def footer(self) -> str:
        """One line: what this query cost and what is left."""
        parts = []
        if self.dry_run:
            parts.append(f"dry run: nothing charged; it would spend {_amount(self.cost)}")
        elif self.replayed:
            parts.append("replayed (no cost)")
        else:
            parts.append(f"{_amount(self.cost)} spent")
        left = _left(self.budget)
        if left:
            parts.append(left)
        shown = len(self._shown_rows())
        if shown < len(self.rows):
            parts.append(f"showing {shown} of {len(self.rows)} rows")
        return " · ".join(parts)

    def _repr_html_(self) -> str:
        body = self._plan_html() if self.dry_run else self._table_html()
        footer = f'<div class="dpmagic-footer" style="{MUTED}">{escape(self.footer())}</div>'
        return f'<div class="dpmagic-result">{body}{footer}</div>'

    def _table_html(self) -> str:
        head = "".join(f"<th>{escape(str(c))}</th>" for c in self.columns)
        percent = f"{self.confidence:.0%}"
        body = []
        for r in self._shown_rows():
            cells = []
            for c, value in enumerate(self.rows[r]):
                pair = self._interval_at(c, r)
                text = escape(format_value(value))
                if pair is None:
                    cells.append(f"<td>{text}</td>")
                    continue
                lo, hi = pair
                tip = escape(f"{percent} interval [{format_value(lo)}, {format_value(hi)}]")
                cells.append(f'<td title="{tip}" style="{NOISY_CELL}">{text}</td>')
            body.append(f"<tr>{''.join(cells)}</tr>")
        return _table(head, body)

    def _plan_html(self) -> str:
        head = "".join(f"<th>{escape(h)}</th>" for h in PLAN_HEADERS)
        body = [
            "<tr>" + "".join(f"<td>{escape(v)}</td>" for v in _plan_row(step)) + "</tr>"
            for step in self.plan
        ]
        return _table(head, body)

    def __repr__(self) -> str:
        if self.dry_run:
            table = pd.DataFrame([_plan_row(s) for s in self.plan], columns=PLAN_HEADERS)
        else:
            shown = [[format_value(v) for v in self.rows[r]] for r in self._shown_rows()]
            table = pd.DataFrame(shown, columns=self.columns)
        text = table.to_string(index=False) if len(table) else "(no rows)"
        return f"{text}\n{self.footer()}"


PLAN_HEADERS = (
    "aggregate",
    "bounds",
    "sensitivity",
    "mechanism",
    "scale",
    "cost",
    "95% error ±",
    "public keys",
)


def _plan_row(step: dict[str, Any]) -> list[str]:
    bounds = step.get("bounds")
    cost = step.get("cost") or {"epsilon": step.get("epsilon")}
    keys = step.get("keys") or []
    return [
        str(step.get("aggregate", "")),
        f"[{format_exact(bounds[0])}, {format_exact(bounds[1])}]" if bounds else "",
        f"{format_exact(step.get('sensitivity'))} {step.get('norm', '')}".strip(),
        str(step.get("mechanism", "")),
        format_exact(step.get("scale")),
        f"ρ={format_exact(cost['rho'])}" if "rho" in cost else f"ε={format_exact(cost['epsilon'])}",
        format_exact(step.get("accuracy")),
        ", ".join(f"{k['column']} ({k['values']})" for k in keys if k.get("public")),
    ]


class BudgetView:
    """``GET /v1/budget`` as a small table: the user's cap and this notebook's share."""

    def __init__(self, reply: dict[str, Any], notebook: str) -> None:
        self.reply = reply
        self.notebook = notebook

    def _rows(self) -> tuple[list[str], list[list[str]]]:
        scopes = [("user", "user"), ("notebook", f"notebook {self.notebook}")]
        with_delta = any(
            (self.reply.get(s) or {}).get(k, {}).get("delta")
            for s, _ in scopes
            for k in ("spent", "limit", "remaining")
        )
        headers = ["", "spent ε", "limit ε", "left ε"]
        if with_delta:
            headers += ["spent δ", "limit δ", "left δ"]
        rows = []
        for scope, label in scopes:
            view = self.reply.get(scope) or {}
            row = [label] + [format_exact(view.get(k, {}).get("epsilon")) for k in BUDGET_KEYS]
            if with_delta:
                row += [format_exact(view.get(k, {}).get("delta")) for k in BUDGET_KEYS]
            rows.append(row)
        return headers, rows

    def _repr_html_(self) -> str:
        headers, rows = self._rows()
        head = "".join(f"<th>{escape(h)}</th>" for h in headers)
        body = ["<tr>" + "".join(f"<td>{escape(v)}</td>" for v in r) + "</tr>" for r in rows]
        caption = f'<div style="{MUTED}">dataset {escape(str(self.reply.get("dataset", "")))}</div>'
        return f'<div class="dpmagic-budget">{_table(head, body)}{caption}</div>'

    def __repr__(self) -> str:
        headers, rows = self._rows()
        text = pd.DataFrame(rows, columns=headers).to_string(index=False)
        return f"{text}\ndataset {self.reply.get('dataset', '')}"


BUDGET_KEYS = ("spent", "limit", "remaining")


class SchemaView:
    """``GET /v1/schema``: what may be queried and under which policy."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    def summary(self) -> str:
        r = self.reply
        unit = r.get("privacy_unit")
        return " · ".join(
            [
                f"dataset {r.get('dataset', '')}",
                f"privacy unit {unit}" if unit else "privacy unit: each row",
                f"neighbouring {r.get('neighbouring', '')}",
                f"each unit in ≤ {r.get('max_partitions')} groups, "
                f"≤ {r.get('max_rows_per_partition')} rows per group",
                f"budget: user {_amount(r.get('user_budget') or {})}, "
                f"notebook {_amount(r.get('notebook_budget') or {})}, "
                f"query default {_amount(r.get('query_default') or {})}",
            ]
        )

    def _tables(self) -> list[tuple[str, list[list[str]]]]:
        out = []
        for name, table in (self.reply.get("tables") or {}).items():
            title = f"{name} (public)" if table.get("public") else name
            rows = []
            for col, info in (table.get("columns") or {}).items():
                values = info.get("public_values")
                rows.append(
                    [
                        col,
                        str(info.get("type", "")),
                        _bounds(info.get("lower"), info.get("upper")),
                        ", ".join(format_exact(v) for v in values) if values is not None else "",
                    ]
                )
            out.append((title, rows))
        return out

    def _repr_html_(self) -> str:
        parts = [f'<div style="{MUTED}">{escape(self.summary())}</div>']
        head = "".join(f"<th>{escape(h)}</th>" for h in SCHEMA_HEADERS)
        for title, rows in self._tables():
            body = ["<tr>" + "".join(f"<td>{escape(v)}</td>" for v in r) + "</tr>" for r in rows]
            parts.append(f"<div><strong>{escape(title)}</strong></div>{_table(head, body)}")
        return f'<div class="dpmagic-schema">{"".join(parts)}</div>'

    def __repr__(self) -> str:
        parts = [self.summary()]
        for title, rows in self._tables():
            frame = pd.DataFrame(rows, columns=list(SCHEMA_HEADERS))
            parts.append(f"\n{title}\n{frame.to_string(index=False)}")
        return "\n".join(parts)


SCHEMA_HEADERS = ("column", "type", "bounds", "public values")


def format_value(value: Any) -> str:
    """A number as a reader wants it: integers whole, noisy floats to 2 decimals."""
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_exact(value: Any) -> str:
    """A public number (a bound, a budget, a scale) shown in full, without padding."""
    if isinstance(value, float):
        return f"{value:g}"
    return format_value(value)


def _amount(cost: dict[str, Any]) -> str:
    """``ε 0.5`` or ``ε 0.5, δ 1e-06``: δ only when it is in play."""
    text = f"ε {float(cost.get('epsilon') or 0.0):g}"
    delta = float(cost.get("delta") or 0.0)
    return f"{text}, δ {delta:g}" if delta else text


def _left(budget: dict[str, Any]) -> str:
    parts = []
    for scope in ("notebook", "user"):
        remaining = (budget.get(scope) or {}).get("remaining")
        if remaining is not None:
            parts.append(f"{_amount(remaining)} left for the {scope}")
    return ", ".join(parts)


def _bounds(lower: Any, upper: Any) -> str:
    if lower is None and upper is None:
        return ""
    lo = "-∞" if lower is None else format_exact(lower)
    hi = "∞" if upper is None else format_exact(upper)
    return f"[{lo}, {hi}]"


def _table(head: str, body: list[str]) -> str:
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
