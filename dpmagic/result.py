"""What the notebook shows for a gate reply: answers, their accuracy, their cost.

A noisy number is only useful next to how noisy it is and what it cost, so
the rendering puts each cell's 95% interval in a tooltip and closes with a
footer of the ε spent and left. Every string here came over the wire, so
everything is HTML-escaped; colours are inherited from the front end's theme
(JupyterLab's CSS variables, with plain fallbacks) so dark mode just works.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from html import escape
from typing import Any

import pandas as pd

from dpmagic.render import MUTED, STYLE, budget_bar, spend_chart, table


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

    @cached_property
    def pl(self) -> Any:
        """The noisy answer as a polars DataFrame (needs ``pip install polars``)."""
        try:
            import polars
        except ImportError:
            raise ImportError("polars is not installed: pip install polars") from None
        return polars.DataFrame(
            self.rows, schema=self.columns, orient="row", strict=False, infer_schema_length=None
        )

    @property
    def confidence(self) -> float:
        """The coverage of the reported intervals, e.g. 0.95."""
        return 1.0 - float(self.accuracy.get("alpha", 0.05))

    def interval(self, column: str) -> pd.DataFrame:
        """Each row's interval for ``column`` as a DataFrame of ``lo`` and ``hi``
        (NaN where an expression's interval is unknown)."""
        info = self._noisy_column(column)
        if "rank_radius" in info:
            raise ValueError(
                f"column {column!r} is a quantile: its accuracy is in ranks, "
                f"see rank_radius({column!r})"
            )
        nan = float("nan")
        pairs = [(p[0], p[1]) if p else (nan, nan) for p in info["intervals"]]
        return pd.DataFrame(pairs, columns=["lo", "hi"], index=self.df.index)

    def rank_radius(self, column: str) -> float:
        """For a quantile column, ``r`` such that with the reported confidence each
        released value's rank imbalance is within ``r`` of the best candidate's
        (see the README's "Accuracy of quantiles")."""
        info = self._noisy_column(column)
        if "rank_radius" not in info:
            raise ValueError(f"column {column!r} is not a quantile: see interval({column!r})")
        return float(info["rank_radius"])

    def _noisy_column(self, column: str) -> dict[str, Any]:
        if column not in self.columns:
            raise KeyError(f"no column {column!r}; columns are {self.columns}")
        info = self._column_accuracy(self.columns.index(column))
        if info is None:
            raise ValueError(f"column {column!r} is a group key: it carries no noise")
        return info

    def _column_accuracy(self, index: int) -> dict[str, Any] | None:
        columns = self.accuracy.get("columns") or []
        return columns[index] if index < len(columns) else None

    def _interval_at(self, column: int, row: int) -> tuple[Any, Any] | None:
        info = self._column_accuracy(column)
        intervals = (info or {}).get("intervals") or []
        pair = intervals[row] if row < len(intervals) else None
        return (pair[0], pair[1]) if pair else None

    def _accuracy_text(self, column: int, row: int, percent: str) -> tuple[str, str] | None:
        """A cell's accuracy as its hidden span and its tooltip, if it has one."""
        info = self._column_accuracy(column) or {}
        if "rank_radius" in info:
            radius = format_value(float(info["rank_radius"]))
            level = format_value(float(info["level"]))
            tip = f"{percent}: rank within ±{radius} of the {level}-quantile's, ties aside"
            return f"±{radius} ranks", tip
        pair = self._interval_at(column, row)
        if pair is None:
            return None
        span = f"[{format_value(pair[0])}, {format_value(pair[1])}]"
        if info.get("interval") == "normal approximation":  # randomized response, debiased
            return span, f"{percent} interval {span}, a normal approximation"
        return span, f"{percent} interval {span}"

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
        chosen = self.accuracy.get("partition_selection")
        if chosen:
            parts.append(
                f"keys chosen from the data: kept where noisy units ≥ {chosen['threshold']} "
                f"(δ={format_exact(chosen['delta'])})"
            )
        shown = len(self._shown_rows())
        if shown < len(self.rows):
            parts.append(f"showing {shown} of {len(self.rows)} rows")
        return " · ".join(parts)

    def _repr_html_(self) -> str:
        body = self._plan_html() if self.dry_run else self._table_html()
        return f'<div class="dpmagic dpmagic-result">{STYLE}{body}{self._footer_html()}</div>'

    def _footer_html(self) -> str:
        bars = []
        for scope in ("notebook", "user"):
            spent = _epsilon(self.budget, scope, "spent")
            limit = _epsilon(self.budget, scope, "limit")
            if spent is None or not limit:
                continue
            this = 0.0 if self.replayed or self.dry_run else float(self.cost.get("epsilon") or 0)
            bar = budget_bar(spent, limit, this, scope)
            bars.append(f'<span class="dpm-muted">{scope}</span>{bar}')
        return (
            f'<div class="dpmagic-footer" style="{MUTED}">'
            f'<span class="dpm-footer-text">{escape(self.footer())}</span>'
            f'<div class="dpm-bars">{"".join(bars)}</div></div>'
        )

    def _table_html(self) -> str:
        percent = f"{self.confidence:.0%}"
        noisy = any(self._column_accuracy(c) for c in range(len(self.columns)))
        body = []
        for r in self._shown_rows():
            cells = []
            for c, value in enumerate(self.rows[r]):
                text = escape(format_value(value))
                shown = self._accuracy_text(c, r, percent)
                if shown is None:
                    cells.append(f"<td>{text}</td>")
                    continue
                span, tip = shown
                cells.append(
                    f'<td class="dpm-noisy" title="{escape(tip)}">{text}'
                    f'<span class="dpm-int" style="display:none">{escape(span)}</span></td>'
                )
            body.append(cells)
        toggle = (
            f'<details class="dpm-toggle"><summary>{percent} intervals</summary></details>'
            if noisy and body
            else ""
        )
        return toggle + table(self.columns, body, raw=True)

    def _plan_html(self) -> str:
        return table(PLAN_HEADERS, [_plan_row(step) for step in self.plan])

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
    "keys",
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
        _step_cost(cost),
        format_exact(step.get("accuracy")),
        ", ".join(_key_text(k, step) for k in keys),
    ]


def _step_cost(cost: dict[str, Any]) -> str:
    if "rho" in cost:
        return f"ρ={format_exact(cost['rho'])}"
    text = f"ε={format_exact(cost['epsilon'])}"
    return text + (f", δ={format_exact(cost['delta'])}" if cost.get("delta") else "")


def _key_text(key: dict[str, Any], step: dict[str, Any]) -> str:
    """A public key with how many values it has; a private one with how it is chosen."""
    if key.get("public", True):
        return f"{key['column']} ({key['values']} public)"
    if step.get("kind") == "partition_selection":
        return f"{key['column']} (private: kept if noisy units ≥ {step.get('threshold')})"
    return f"{key['column']} (private: DP partition selection)"


@dataclass(frozen=True)
class DatasetBudget:
    """One dataset's ``GET /v1/budget`` reply and this notebook's ``GET /v1/history``."""

    budget: dict[str, Any]
    history: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.budget.get("dataset", ""))


class BudgetView:
    """``%dpbudget``: per dataset, what the user and this notebook spent and have
    left, the notebook's queries in order, and a picture of the spending."""

    def __init__(self, datasets: list[DatasetBudget], notebook: str) -> None:
        self.datasets = datasets
        self.notebook = notebook

    def __getitem__(self, dataset: str) -> DatasetBudget:
        for entry in self.datasets:
            if entry.name == dataset:
                return entry
        raise KeyError(f"no dataset {dataset!r}; shown are {[d.name for d in self.datasets]}")

    def _scopes(self, entry: DatasetBudget) -> tuple[list[str], list[tuple[str, list[str]]]]:
        scopes = [("user", "you, all notebooks"), ("notebook", f"notebook {self.notebook}")]
        with_delta = any(
            (entry.budget.get(s) or {}).get(k, {}).get("delta")
            for s, _ in scopes
            for k in BUDGET_KEYS
        )
        headers = ["", "spent ε", "limit ε", "left ε"]
        if with_delta:
            headers += ["spent δ", "limit δ", "left δ"]
        rows = []
        for scope, label in scopes:
            view = entry.budget.get(scope) or {}
            row = [label] + [format_exact(view.get(k, {}).get("epsilon")) for k in BUDGET_KEYS]
            if with_delta:
                row += [format_exact(view.get(k, {}).get("delta")) for k in BUDGET_KEYS]
            rows.append((scope, row))
        return headers, rows

    def _history_rows(self, entry: DatasetBudget) -> list[list[str]]:
        return [
            [
                _time(item.get("time")),
                " ".join(str(item.get("sql", "")).split()),
                _amount(item.get("cost") or {}),
                STATUS_TEXT.get(str(item.get("status")), str(item.get("status", ""))),
            ]
            for item in entry.history
        ]

    def _repr_html_(self) -> str:
        parts = [STYLE]
        for entry in self.datasets:
            headers, rows = self._scopes(entry)
            body = []
            for scope, row in rows:
                bar = budget_bar(
                    _epsilon(entry.budget, scope, "spent") or 0.0,
                    _epsilon(entry.budget, scope, "limit") or 0.0,
                    label=scope,
                )
                label, *numbers = row
                body.append(
                    [f'<td style="text-align: left">{escape(label)}</td>']
                    + [f"<td>{escape(v)}</td>" for v in numbers]
                    + [f"<td>{bar}</td>"]
                )
            parts.append(f"<div><strong>dataset {escape(entry.name)}</strong></div>")
            parts.append(table([*headers, ""], body, raw=True))
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
            limit = _epsilon(entry.budget, "notebook", "limit") or 0.0
            costs = [float((i.get("cost") or {}).get("epsilon") or 0) for i in entry.history]
            parts.append(
                spend_chart(costs, limit, f"ε spent by notebook {self.notebook}, query by query")
            )
        return f'<div class="dpmagic dpmagic-budget">{"".join(parts)}</div>'

    def __repr__(self) -> str:
        parts = []
        for entry in self.datasets:
            headers, rows = self._scopes(entry)
            frame = pd.DataFrame([row for _, row in rows], columns=headers)
            parts.append(f"dataset {entry.name}\n{frame.to_string(index=False)}")
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
    "replayed": "replayed (no cost)",
    "failed": "failed (charged)",
    "charged": "running (charged)",
}
SQL_SHOWN_CHARS = 80


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

    def _tables(self) -> list[tuple[str, str, list[list[str]]]]:
        out = []
        for name, info_table in (self.reply.get("tables") or {}).items():
            public = bool(info_table.get("public"))
            title = f"{name} (public)" if public else name
            unit = self._unit(info_table)
            rows = []
            for col, info in (info_table.get("columns") or {}).items():
                values = info.get("public_values")
                rows.append(
                    [
                        col,
                        str(info.get("type", "")),
                        _bounds(info.get("lower"), info.get("upper")),
                        ", ".join(format_exact(v) for v in values) if values is not None else "",
                        self._use(col, info, public, unit),
                    ]
                )
            out.append((title, self._privacy(name, info_table, unit), rows))
        return out

    def _unit(self, info_table: dict[str, Any]) -> str | None:
        """The column holding the table's privacy unit (older gates name only the dataset's)."""
        if info_table.get("public"):
            return None
        return info_table.get("unit") or self.reply.get("privacy_unit")

    def _privacy(self, name: str, info_table: dict[str, Any], unit: str | None) -> str:
        """One line on whose privacy the table's rows carry, from the policy alone."""
        if info_table.get("public"):
            return "public: no privacy unit, no privacy cost"
        held = f"privacy unit in column {unit}" if unit else "each row is its own privacy unit"
        links = [f"{name}.{c} → {t}" for c, t in (info_table.get("links") or {}).items()]
        bounds = (
            f"each unit in ≤ {self.reply.get('max_partitions')} groups, "
            f"≤ {self.reply.get('max_rows_per_partition')} rows per group"
        )
        return " · ".join(["private", held, *(f"links {link}" for link in links), bounds])

    def _use(self, column: str, info: dict[str, Any], public: bool, unit: str | None) -> str:
        """How the column can appear in a query, from the policy's declarations alone."""
        if public:
            return "public table: no privacy cost"
        if column == unit:
            return "privacy unit: never shown or grouped by"
        randomized = info.get("randomized_response")
        if isinstance(randomized, dict):
            return (
                f"randomized response (p = {format_exact(randomized.get('p'))}): "
                "GROUP BY with COUNT, SUM/AVG, debiased"
            )
        uses = []
        if info.get("public_values") is not None:
            uses.append("GROUP BY")
        elif self.reply.get("accountant") == "approx":
            uses.append("GROUP BY with δ > 0 (keys kept by DP partition selection)")
        if info.get("lower") is not None and info.get("upper") is not None:
            uses.append("SUM/AVG")
        return ", ".join([*uses, "WHERE, COUNT"])

    def _repr_html_(self) -> str:
        parts = [STYLE, f'<div style="{MUTED}">{escape(self.summary())}</div>']
        for title, privacy, rows in self._tables():
            parts.append(
                f"<div><strong>{escape(title)}</strong> "
                f'<span style="{MUTED}">{escape(privacy)}</span></div>'
            )
            parts.append(table(SCHEMA_HEADERS, rows, text=True))
        return f'<div class="dpmagic dpmagic-schema">{"".join(parts)}</div>'

    def __repr__(self) -> str:
        parts = [self.summary()]
        for title, privacy, rows in self._tables():
            frame = pd.DataFrame(rows, columns=list(SCHEMA_HEADERS))
            parts.append(f"\n{title}: {privacy}\n{frame.to_string(index=False)}")
        return "\n".join(parts)


SCHEMA_HEADERS = ("column", "type", "bounds", "public values", "use in a query")


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


def _epsilon(budget: dict[str, Any], scope: str, key: str) -> float | None:
    """``budget[scope][key]["epsilon"]`` of a budget view, if the gate sent it."""
    value = ((budget.get(scope) or {}).get(key) or {}).get("epsilon")
    return None if value is None else float(value)


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
