"""Charts drawn on the server as inline SVG: no script, no library, nothing fetched.

A budget's bar shows what it spent of its limit; its chart shows spending over time
as steps (spending changes only at a charge, a reset or a renewal) under the limit's
own steps (a grant raises it, a reset brings it back to the policy's). Each point
keeps its exact numbers in a ``<title>``, which a browser shows on hover.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpmagic.gate.console.layout import esc, number, when
from dpmagic.gate.owner import Point

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 26, 30
SPENT, LIMIT, TRACK = "#2f7ed8", "#c0392b", "#e3e7eb"
BAR_W, BAR_H = 160, 12


def bar(spent: float, limit: float) -> str:
    """``spent`` of ``limit`` as a filled bar (full, and red, once all is spent)."""
    share = 1.0 if limit <= 0 else max(0.0, min(1.0, spent / limit))
    fill = LIMIT if share >= 1.0 else SPENT
    label = f"spent ε={number(spent)} of {number(limit)}"
    return (
        f'<svg width="{BAR_W}" height="{BAR_H}" role="img" aria-label="{esc(label)}">'
        f"<title>{esc(label)}</title>"
        f'<rect width="{BAR_W}" height="{BAR_H}" fill="{TRACK}"/>'
        f'<rect width="{share * BAR_W:.1f}" height="{BAR_H}" fill="{fill}"/></svg>'
    )


def spending_chart(points: Sequence[Point], title: str) -> str:
    """Spending (ε) over time as steps, with the limit's steps dashed above it."""
    if not points:
        return ""
    start, end = points[0].time, points[-1].time
    span = max((end - start).total_seconds(), 1.0)
    top = max(max(p.spent for p in points), max(p.limit or 0.0 for p in points), 1e-9)

    def x(i: int) -> float:
        return LEFT + (points[i].time - start).total_seconds() / span * (WIDTH - LEFT - RIGHT)

    def y(value: float) -> float:
        return TOP + (1 - value / (top * 1.05)) * (HEIGHT - TOP - BOTTOM)

    spent = _steps([(x(i), y(p.spent)) for i, p in enumerate(points)])
    limits = [(x(i), y(p.limit)) for i, p in enumerate(points) if p.limit is not None]
    limit_line = (
        f'<polyline points="{_steps(limits)}" fill="none" stroke="{LIMIT}" stroke-dasharray="5 3"/>'
        if limits
        else ""
    )
    dots = "".join(
        f'<circle cx="{x(i):.1f}" cy="{y(p.spent):.1f}" r="3" fill="{SPENT}">'
        f"<title>{esc(when(p.time))} UTC: spent ε={number(p.spent)}"
        f"{'' if p.limit is None else f' of {number(p.limit)}'}</title></circle>"
        for i, p in enumerate(points)
    )
    last = points[-1]
    summary = f"{title}: spent ε={number(last.spent)}" + (
        "" if last.limit is None else f" of {number(last.limit)}"
    )
    axis_y = HEIGHT - BOTTOM
    return (
        f'<svg class="chart" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{esc(summary)}"><title>{esc(summary)}</title>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{axis_y}" stroke="#9aa4ae"/>'
        f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" y2="{axis_y}" stroke="#9aa4ae"/>'
        f'<text x="{LEFT - 6}" y="{axis_y}" text-anchor="end">0</text>'
        f'<text x="{LEFT - 6}" y="{y(top) + 4:.1f}" text-anchor="end">{esc(number(top))}</text>'
        f'<text x="{LEFT}" y="{HEIGHT - 10}">{esc(when(start))}</text>'
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 10}" text-anchor="end">'
        f"{esc(when(end))} UTC</text>"
        f'<text x="{WIDTH - RIGHT}" y="14" text-anchor="end">ε spent (solid), limit (dashed)'
        "</text>"
        f"{limit_line}"
        f'<polyline points="{spent}" fill="none" stroke="{SPENT}" stroke-width="2"/>'
        f"{dots}</svg>"
    )


def _steps(points: list[tuple[float, float]]) -> str:
    """A step line through ``points``: each value holds until the next point's time."""
    out: list[str] = []
    for i, (px, py) in enumerate(points):
        if i:
            out.append(f"{px:.1f},{points[i - 1][1]:.1f}")
        out.append(f"{px:.1f},{py:.1f}")
    return " ".join(out)
