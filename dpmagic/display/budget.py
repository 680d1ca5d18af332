"""What ``%dpbudget`` shows: each dataset's ε spent and left, per notebook and user,
what more queries that allows (``preview``), and this notebook's history of
charges, from ``GET /v1/budget`` and ``/v1/history``. Every string came over the
wire, so everything is escaped."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

import msgspec
import pandas as pd

from dpmagic.display.preview import preview_html, preview_markdown, preview_note, preview_text
from dpmagic.display.render import (
    BUDGET_METADATA,
    MUTED,
    STYLE,
    amount,
    budget_bar,
    budget_number,
    markdown_escape,
    markdown_table,
    spend_chart,
    table,
)
from dpmagic.protocol import Budgets, Cost, Standing


@dataclass(frozen=True)
class DatasetBudget:
    """One dataset's ``GET /v1/budget`` reply and this notebook's ``GET /v1/history``."""

    budget: dict[str, Any]
    history: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.budget.get("dataset", ""))

    @property
    def views(self) -> Budgets:
        """The budgets of the reply, typed (the rest of it, ``dataset`` and
        ``preview``, left out)."""
        return msgspec.convert(self.budget, Budgets)

    @property
    def preview(self) -> dict[str, Any] | None:
        """The gate's utility preview, when it sent one (a transcript has none)."""
        return self.budget.get("preview")


class BudgetView:
    """``%dpbudget``: per dataset, what the user and this notebook spent and have
    left, what more that allows (with ``preview``: asked for, it is shown or its
    absence said), the notebook's queries in order, and a picture of the spending."""

    def __init__(self, datasets: list[DatasetBudget], notebook: str, preview: bool = False) -> None:
        self.datasets = datasets
        self.notebook = notebook
        self.preview = preview

    def rename_note(self) -> str:
        """What the notebook's name means for its budget: users rename notebooks."""
        return (
            f"charged as notebook {self.notebook}; renamed or moved, a notebook starts a "
            "new notebook budget, drawn from the same user budget (its answers still "
            "replay at no cost)"
        )

    def __getitem__(self, dataset: str) -> DatasetBudget:
        for entry in self.datasets:
            if entry.name == dataset:
                return entry
        raise KeyError(f"no dataset {dataset!r}; shown are {[d.name for d in self.datasets]}")

    def _scopes(self, entry: DatasetBudget) -> tuple[list[str], list[tuple[Standing, list[str]]]]:
        """Each budget the gate sent, widest first: the dataset's (all users) and the
        user's groups' where the owner set them, then the user's and the notebook's;
        a renewing one says its period and when the next begins."""
        views = entry.views
        scopes: list[tuple[Standing, str]] = []
        if views.dataset_budget is not None:
            scopes.append((views.dataset_budget, "the dataset, all users together"))
        for group, view in sorted((views.groups or {}).items()):
            scopes.append((view, f"group {group}, its members together"))
        if views.user is not None:
            scopes.append((views.user, "you, all notebooks"))
        if views.notebook is not None:
            scopes.append((views.notebook, f"notebook {self.notebook}"))
        with_delta = any(c.delta for view, _ in scopes for c in _amounts(view))
        headers = ["", "spent ε", "limit ε", "left ε"]
        if with_delta:
            headers += ["spent δ", "limit δ", "left δ"]
        rows = []
        for view, label in scopes:
            if view.renew is not None:
                label += f" (renews each {view.renew.period}; next {_time(view.renew.next)})"
            # Spent rounded up, the limit and what is left down (``budget_number``).
            amounts = list(enumerate(_amounts(view)))
            row = [label] + [budget_number(c.epsilon, up=i == 0) for i, c in amounts]
            if with_delta:
                row += [budget_number(c.delta, up=i == 0) for i, c in amounts]
            rows.append((view, row))
        return headers, rows

    def _history_rows(self, entry: DatasetBudget) -> list[list[str]]:
        return [
            [
                _time(item.get("time")),
                " ".join(str(item.get("sql", "")).split()),
                amount(item.get("cost") or {}),
                STATUS_TEXT.get(str(item.get("status")), str(item.get("status", ""))),
            ]
            for item in entry.history
        ]

    def _repr_html_(self) -> str:
        parts = [STYLE]
        parts.append(f'<div style="{MUTED}">{escape(self.rename_note())}</div>')
        for entry in self.datasets:
            headers, rows = self._scopes(entry)
            body = []
            for view, row in rows:
                bar = budget_bar(view.spent.epsilon, view.limit.epsilon, label=row[0])
                label, *numbers = row
                body.append(
                    [f'<td style="text-align: left">{escape(label)}</td>']
                    + [f"<td>{escape(v)}</td>" for v in numbers]
                    + [f"<td>{bar}</td>"]
                )
            parts.append(f"<div><strong>dataset {escape(entry.name)}</strong></div>")
            parts.append(table([*headers, ""], body, raw=True))
            if self.preview:
                parts.append(f'<div style="{MUTED}">{escape(preview_note(entry.preview))}</div>')
                parts.append(preview_html(entry.preview))
            history = self._history_rows(entry)
            if not history:
                parts.append(f'<div style="{MUTED}">no queries from this notebook yet</div>')
                continue
            body = [
                [f'<td class="dpm-nowrap">{escape(t)}</td>', _sql_cell(sql),
                 f'<td class="dpm-nowrap">{escape(c)}</td>', f"<td>{escape(st)}</td>"]
                for t, sql, c, st in history
            ]  # fmt: skip
            parts.append(table(HISTORY_HEADERS, body, raw=True, text=True))
            limit = _notebook_limit(entry.views)
            costs = [float((i.get("cost") or {}).get("epsilon") or 0) for i in entry.history]
            parts.append(
                spend_chart(costs, limit, f"ε spent by notebook {self.notebook}, query by query")
            )
        return f'<div class="dpmagic dpmagic-budget">{"".join(parts)}</div>'

    def _repr_markdown_(self) -> str:
        """The same tables for viewers that drop HTML's styles; the chart as numbers."""
        parts = [f"_{markdown_escape(self.rename_note())}_\n"]
        for entry in self.datasets:
            headers, rows = self._scopes(entry)
            parts.append(f"**dataset {markdown_escape(entry.name)}**\n")
            parts.append(markdown_table(headers, [row for _, row in rows]))
            if self.preview:
                parts.append(f"\n_{markdown_escape(preview_note(entry.preview))}_\n")
                parts.append(preview_markdown(entry.preview))
            history = self._history_rows(entry)
            if not history:
                parts.append("\n_no queries from this notebook yet_\n")
                continue
            shown = [[t, _shorten(sql, SQL_SHOWN_CHARS), c, st] for t, sql, c, st in history]
            parts.append("\n" + markdown_table(HISTORY_HEADERS, shown))
            total, steps = 0.0, []
            for item in entry.history:
                total += float((item.get("cost") or {}).get("epsilon") or 0)
                steps.append(budget_number(total, up=True))
            limit = _notebook_limit(entry.views)
            parts.append(
                f"\n_ε spent by notebook {markdown_escape(self.notebook)}, query by query: "
                f"{' → '.join(steps)} (limit {budget_number(limit)})_\n"
            )
        return "\n".join(parts)

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """As a result's: HTML, Markdown and text, and the notebook's ε left for the
        status bar (of the only dataset shown, when one is)."""
        data = {
            "text/html": self._repr_html_(),
            "text/markdown": self._repr_markdown_(),
            "text/plain": repr(self),
        }
        if len(self.datasets) != 1:
            return data, {}
        view = self.datasets[0].views.notebook
        if view is None:
            return data, {}
        note = {"notebook": self.notebook, "dataset": self.datasets[0].name,
                "epsilon_left": view.remaining.epsilon,
                "epsilon_limit": view.limit.epsilon}  # fmt: skip
        return data, {BUDGET_METADATA: note}

    def __repr__(self) -> str:
        parts = [self.rename_note()]
        for entry in self.datasets:
            headers, rows = self._scopes(entry)
            frame = pd.DataFrame([row for _, row in rows], columns=headers)
            parts.append(f"dataset {entry.name}\n{frame.to_string(index=False)}")
            if self.preview:
                parts.append(f"{preview_note(entry.preview)}\n{preview_text(entry.preview)}")
            history = self._history_rows(entry)
            if history:
                shown = [[t, _shorten(sql, 60), c, st] for t, sql, c, st in history]
                frame = pd.DataFrame(shown, columns=list(HISTORY_HEADERS))
                parts.append(f"queries of notebook {self.notebook}\n{frame.to_string(index=False)}")
            else:
                parts.append("no queries from this notebook yet")
        return "\n\n".join(parts)


HISTORY_HEADERS = ("time (UTC)", "query", "cost", "")
STATUS_TEXT = {
    "released": "answered",
    "replayed": "replayed",
    "failed": "failed (charged)",
    "charged": "running (charged)",
}
SQL_SHOWN_CHARS = 80


def _amounts(view: Standing) -> tuple[Cost, Cost, Cost]:
    """A budget's spent, limit and what is left, in the table's order."""
    return view.spent, view.limit, view.remaining


def _notebook_limit(views: Budgets) -> float:
    """The notebook's ε limit, for the spend chart's line (0 where the gate sent none)."""
    return 0.0 if views.notebook is None else views.notebook.limit.epsilon


def _time(stamp: Any) -> str:
    """A ledger timestamp (UTC, ISO 8601) to the second."""
    try:
        return datetime.fromisoformat(str(stamp)).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return str(stamp or "")


def _shorten(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _sql_cell(sql: str) -> str:
    """A query cut to one short line, whole in its tooltip."""
    short = _shorten(sql, SQL_SHOWN_CHARS)
    return f'<td title="{escape(sql)}" style="text-align: left"><code>{escape(short)}</code></td>'
