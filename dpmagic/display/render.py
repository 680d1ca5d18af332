"""HTML building blocks shared by the notebook views: tables, budget bars, a spend chart.

Outputs are rendered by JupyterLab, classic Notebook, VS Code and nbconvert,
light or dark. So colours come only from JupyterLab's CSS variables (with
neutral fallbacks, never white or black), the layout is plain HTML and
inline SVG (no script, no plotting library), and every piece stays readable
when a front end strips the ``<style>`` block: hidden extras carry an inline
``display:none`` and the essentials sit in ``title`` tooltips.

Every string passed in is escaped here; callers hand over raw text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from html import escape
from typing import Any

from dpmagic.protocol import Budgets, Cost

MUTED = "color: var(--jp-ui-font-color2, inherit); opacity: 0.85; font-size: 0.9em"
# Earlier spending, this query's share, and what is left.
SPENT = "var(--jp-brand-color1, #1976d2)"
THIS_QUERY = "var(--jp-warn-color1, #f57c00)"
TRACK = "var(--jp-layout-color3, rgba(127, 127, 127, 0.3))"
BAR_WIDTH_PX = 84

# Scoped to .dpmagic so nothing leaks into the rest of the page. The interval
# toggle is a <details> element: CSS alone opens the intervals, no ids needed,
# so identical replies render to identical HTML (re-runs compare equal).
STYLE = """<style>
.dpmagic { font-variant-numeric: tabular-nums; }
.dpmagic table { margin: 0.2em 0 0.3em 0; }
.dpmagic th { text-align: right; }
.dpmagic table.dpm-text th, .dpmagic table.dpm-text td { text-align: left; }
.dpmagic td.dpm-noisy { cursor: help; text-decoration: underline dotted; }
.dpmagic details.dpm-toggle { font-size: 0.85em; color: var(--jp-ui-font-color2, inherit); }
.dpmagic details.dpm-toggle > summary { cursor: pointer; list-style: none; }
.dpmagic details.dpm-toggle > summary::-webkit-details-marker { display: none; }
.dpmagic details.dpm-toggle[open] > summary::before { content: "\\2212 "; }
.dpmagic details.dpm-toggle:not([open]) > summary::before { content: "+ "; }
.dpmagic details.dpm-toggle[open] ~ table .dpm-int { display: inline-block !important; }
.dpmagic .dpm-int { color: var(--jp-ui-font-color2, inherit); font-size: 0.85em;
  margin-left: 0.4em; white-space: nowrap; }
.dpmagic .dpm-bar { display: inline-flex; vertical-align: middle; height: 0.55em;
  border-radius: 0.3em; overflow: hidden; margin: 0 0.5em 0 0.25em; }
.dpmagic .dpm-bar > span { display: block; height: 100%; flex: none; }
.dpmagic td.dpm-nowrap { white-space: nowrap; }
.dpmagic .dpm-muted { color: var(--jp-ui-font-color2, inherit); }
.dpmagic td.dpm-dominated { color: var(--jp-ui-font-color2, inherit); }
.dpmagic .dpm-flag { font-size: 0.75em; margin-left: 0.4em; padding: 0 0.3em;
  border: 1px solid var(--jp-warn-color1, currentColor); border-radius: 0.3em;
  color: var(--jp-warn-color1, inherit); white-space: nowrap; }
.dpmagic .dpm-mock { margin: 0.2em 0; padding: 0.15em 0.5em; display: inline-block;
  border: 1px dashed var(--jp-warn-color1, currentColor); color: var(--jp-warn-color1, inherit); }
.dpmagic svg text { fill: var(--jp-ui-font-color2, currentColor); font-size: 10px; }
</style>"""


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, raw: bool = False, text: bool = False
) -> str:
    """A plain table; cells are escaped unless ``raw`` (then the caller escaped them).

    ``text`` left-aligns it: JupyterLab right-aligns every cell, which suits
    numbers but not lists of names or SQL.
    """
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(c if raw else f"<td>{escape(c)}</td>" for c in row) + "</tr>"
        for row in rows
    )
    opening = '<table class="dpm-text">' if text else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def budget_bar(spent: float, limit: float, this_query: float = 0.0, label: str = "") -> str:
    """A small horizontal bar: earlier spending, this query's share, what is left.

    It is an ARIA meter with the numbers in its tooltip, so the picture is
    never the only way to read them.
    """
    if not limit or limit <= 0:
        return ""
    before = _fraction(spent - this_query, limit)
    now = _fraction(spent, limit) - before
    tip = f"{label}: ε {budget_number(spent, up=True)} of {budget_number(limit)} spent".strip(": ")
    return (
        f'<span class="dpm-bar" role="meter" aria-valuemin="0" aria-valuemax="{limit:g}" '
        f'aria-valuenow="{spent:g}" aria-valuetext="{escape(tip)}" title="{escape(tip)}" '
        f'style="width: {BAR_WIDTH_PX}px; background: {TRACK}">'
        f'<span style="width: {before:.1%}; background: {SPENT}"></span>'
        f'<span style="width: {now:.1%}; background: {THIS_QUERY}"></span>'
        "</span>"
    )


def spend_chart(costs: Sequence[float], limit: float, title: str) -> str:
    """Cumulative ε over a notebook's queries as a step line under its limit (inline SVG)."""
    if not costs or limit <= 0:
        return ""
    width, height, pad = 320, 90, 14
    top = max(limit, sum(costs))
    step = (width - 2 * pad) / len(costs)

    def y(value: float) -> float:
        return height - pad - (height - 2 * pad) * value / top

    points, total = [f"{pad:.1f},{y(0):.1f}"], 0.0
    for i, cost in enumerate(costs):
        total += cost
        x0, x1 = pad + i * step, pad + (i + 1) * step
        points += [f"{x0:.1f},{y(total):.1f}", f"{x1:.1f},{y(total):.1f}"]
    limit_y = y(limit)
    return (
        f'<svg class="dpm-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
        f'<line x1="{pad}" x2="{width - pad}" y1="{limit_y:.1f}" y2="{limit_y:.1f}" '
        f'stroke="{THIS_QUERY}" stroke-dasharray="4 3"/>'
        # Spaces around each label: where a viewer drops the SVG, its text stays readable.
        f'<text x="{width - pad}" y="{limit_y - 3:.1f}" text-anchor="end">'
        f" limit ε {budget_number(limit)} </text>"
        f'<polyline fill="none" stroke="{SPENT}" stroke-width="2" points="{" ".join(points)}"/>'
        f'<text x="{pad}" y="{height - 2}"> query 1 </text>'
        f'<text x="{width - pad}" y="{height - 2}" text-anchor="end"> … {len(costs)} </text>'
        "</svg>"
    )


def budget_number(value: float, *, up: bool = False, digits: int = 3) -> str:
    """A budget amount to ``digits`` significant digits, rounded down (what is left is
    never overstated) or ``up`` (what is spent never understated): 2.64069 left reads
    ``2.64``, 0.5 stays ``0.5``, a float sum's 0.30000000000000004 reads ``0.3``.

    The one rule for every ε (and δ, ρ) the notebook shows as an amount: a cost, a
    spend, a limit, what is left, in footers, budget tables, bars, charts and plans
    (a plan's step at 0.0583333 and a footer's 0.06 read differently before). Spent
    and costs round up; limits and what is left round down. Not a value to type
    back (``-e 0.0434``, the gate's ask), which is shown as it came."""
    if not math.isfinite(value) or value == 0:
        return f"{value:g}"
    # Twelve digits first: a float sum's last-bit error (0.1 + 0.2) is not a spend.
    exact = Decimal(f"{float(value):.12g}")
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = exact.quantize(step, rounding=ROUND_CEILING if up else ROUND_FLOOR)
    return f"{float(rounded):g}"


def _fraction(part: float, whole: float) -> float:
    return min(1.0, max(0.0, part / whole))


MOCK_LABEL = "mock data — not the real dataset"
"""What every view of a mock answer says it is."""


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


def markdown_table(headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table: what shared and untrusted notebooks can show."""
    lines = [
        "| " + " | ".join(markdown_escape(h) for h in headers) + " |",
        "|" + "---|" * len(headers),
    ]
    lines += ["| " + " | ".join(markdown_escape(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_escape(text: str) -> str:
    """Text safe in a Markdown table cell: no pipes, no HTML, no emphasis."""
    text = escape(" ".join(str(text).split()), quote=False)
    for char in "\\|*_`[]":
        text = text.replace(char, "\\" + char)
    return text


def format_exact(value: Any) -> str:
    """A public number (a bound, a budget, a scale) shown in full, without padding."""
    if isinstance(value, float):
        return f"{value:g}"
    return format_value(value)


BUDGET_METADATA = "dpmagic"
"""Key of the output metadata that carries the notebook's ε left (the status bar reads it)."""


def amount(cost: Cost | Mapping[str, Any], left: bool = False) -> str:
    """``ε 0.5`` or ``ε 0.5, δ 1e-06``: δ only when it is in play; to three significant
    digits (``budget_number``), rounded down for what is ``left``, up otherwise. A
    typed cost, or one of ``/v1/history``'s and the policy's JSON objects."""
    if isinstance(cost, Cost):
        epsilon, delta = cost.epsilon, cost.delta
    else:
        epsilon, delta = float(cost.get("epsilon") or 0.0), float(cost.get("delta") or 0.0)
    text = f"ε {budget_number(epsilon, up=not left)}"
    return f"{text}, δ {budget_number(delta, up=not left)}" if delta else text


def budget_left(budget: Budgets) -> str:
    """What is left: the notebook's (the least of every budget above it), the user's,
    and the shared budgets' (the dataset's, the user's groups'), where the gate sent
    them; which one binds, when it is a shared one."""
    parts = []
    for view, whom in (
        (budget.notebook, "the notebook"),
        (budget.user, "the user"),
        (budget.dataset_budget, "the dataset (all users)"),
    ):
        if view is not None:
            parts.append(f"{amount(view.remaining, left=True)} left for {whom}")
    for group, view in sorted((budget.groups or {}).items()):
        parts.append(f"{amount(view.remaining, left=True)} left for group {group}")
    binding = budget.notebook.binding if budget.notebook is not None else None
    if parts and binding is not None and binding.budget in ("dataset", "group"):
        parts[0] += f" (the {binding.budget}'s budget binds)"
    return ", ".join(parts)
