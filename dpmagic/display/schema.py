"""What ``%dpschema`` shows: the tables, columns, bounds and public values that may be
queried, with how each column may be used, from ``GET /v1/schema``."""

from __future__ import annotations

from html import escape
from typing import Any

import pandas as pd

from dpmagic.display.render import (
    MUTED,
    STYLE,
    amount,
    format_exact,
    format_value,
    markdown_escape,
    markdown_table,
    table,
)


def _count_error(error: dict[str, Any] | None) -> list[str]:
    """What the bounds cost, as the gate states it (``count_error`` of ``/v1/schema``)."""
    if not error:
        return []
    return [
        f"a count's 95% error at ε = {format_value(error['epsilon'])}: "
        f"±{error['ungrouped']}, ±{error['grouped']} grouped"
    ]


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
                *_count_error(r.get("count_error")),
                f"budget: user {amount(r.get('user_budget') or {})}, "
                f"notebook {amount(r.get('notebook_budget') or {})}, "
                f"query default {amount(r.get('query_default') or {})}",
                *(["answered by Spark"] if r.get("engine") == "spark" else []),
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
        if info_table.get("max_rows_per_unit"):
            bounds = f"≤ {info_table['max_rows_per_unit']} row(s) per unit in this table"
        own = ((self.reply.get("count_error") or {}).get("tables") or {}).get(name)
        cost = [f"a count's 95% error at ε = 1: ±{own['grouped']}"] if own else []
        return " · ".join(["private", held, *(f"links {link}" for link in links), bounds, *cost])

    def _use(self, column: str, info: dict[str, Any], public: bool, unit: str | None) -> str:
        """Every way the column can appear in a query, from the policy's declarations alone."""
        if public:
            return "public table: join, filter and group by it at no privacy cost"
        if column == unit:
            return "privacy unit: COUNT(DISTINCT …) and joins on it; never shown or grouped by"
        randomized = info.get("randomized_response")
        if isinstance(randomized, dict):
            return (
                f"randomized response (p = {format_exact(randomized.get('p'))}): "
                "GROUP BY with COUNT, SUM/AVG, debiased"
            )
        kind = str(info.get("type", ""))
        bounded = info.get("lower") is not None and info.get("upper") is not None
        uses = []
        if info.get("public_values") is not None:
            uses.append("GROUP BY")
        elif kind == "int" and bounded:
            uses.append(f"GROUP BY {column} or {column} // 10 (every value in its bounds)")
        elif kind == "date" and bounded:
            uses.append(f"GROUP BY YEAR({column}), MONTH({column}), QUARTER({column})")
        elif self.reply.get("accountant") == "approx":
            uses.append("GROUP BY with δ > 0 (keys kept by DP partition selection)")
        if bounded and kind in ("int", "float"):
            uses.append("SUM/AVG/VARIANCE/STDDEV")
            uses.append("MEDIAN/MIN/MAX/quantiles")
        elif bounded and kind == "bool":
            uses.append("SUM/AVG")
        if kind == "str":
            uses.append("text functions (UPPER, LENGTH, …)")
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

    def _repr_markdown_(self) -> str:
        parts = [f"_{markdown_escape(self.summary())}_\n"]
        for title, privacy, rows in self._tables():
            parts.append(f"**{markdown_escape(title)}** {markdown_escape(privacy)}\n")
            parts.append(markdown_table(SCHEMA_HEADERS, rows) + "\n")
        return "\n".join(parts)

    def __repr__(self) -> str:
        parts = [self.summary()]
        for title, privacy, rows in self._tables():
            frame = pd.DataFrame(rows, columns=list(SCHEMA_HEADERS))
            parts.append(f"\n{title}: {privacy}\n{frame.to_string(index=False)}")
        return "\n".join(parts)


SCHEMA_HEADERS = ("column", "type", "bounds", "public values", "use in a query")


def _bounds(lower: Any, upper: Any) -> str:
    if lower is None and upper is None:
        return ""
    lo = "-∞" if lower is None else format_exact(lower)
    hi = "∞" if upper is None else format_exact(upper)
    return f"[{lo}, {hi}]"
