"""Charts drawn on the server as inline SVG: no script, no library, nothing fetched.

A budget's bar shows what it spent of its limit; its chart shows spending over time
as steps (spending changes only at a charge, a reset or a renewal) under the limit's
own steps (a grant raises it, a reset brings it back to the policy's). Each point
keeps its exact numbers in a ``<title>``, which a browser shows on hover.

Here the geometry is computed; ``templates/_bar.html`` and ``_chart.html`` draw it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpmagic.gate.console.layout import number, when
from dpmagic.gate.owner import Point


@dataclass(frozen=True)
class Geometry:
    """The sizes and colours the charts are computed and drawn with."""

    width: int = 640
    height: int = 200
    left: int = 56
    right: int = 16
    top: int = 26
    bottom: int = 30
    spent: str = "#2f7ed8"
    limit: str = "#c0392b"
    track: str = "#e3e7eb"
    bar_width: int = 160
    bar_height: int = 12

    @property
    def axis_y(self) -> int:
        return self.height - self.bottom

    @property
    def right_x(self) -> int:
        return self.width - self.right


SVG = Geometry()


@dataclass(frozen=True)
class Bar:
    """``spent`` of ``limit`` as a filled bar: its label, its fill's width and colour."""

    label: str
    width: str
    fill: str
    svg: Geometry = SVG


@dataclass(frozen=True)
class Dot:
    """A point of a chart, with its exact numbers as its title."""

    x: str
    y: str
    title: str


@dataclass(frozen=True)
class Chart:
    """A chart's lines (as SVG points), its points and its labels."""

    summary: str
    spent: str
    limits: str  # empty when no point has a limit
    dots: tuple[Dot, ...]
    top: str  # the height of the top value's label
    top_value: str
    start: str
    end: str
    svg: Geometry = SVG


def bar(spent: float, limit: float) -> Bar:
    """``spent`` of ``limit`` as a filled bar (full, and red, once all is spent)."""
    share = 1.0 if limit <= 0 else max(0.0, min(1.0, spent / limit))
    return Bar(
        label=f"spent ε={number(spent)} of {number(limit)}",
        width=f"{share * SVG.bar_width:.1f}",
        fill=SVG.limit if share >= 1.0 else SVG.spent,
    )


def spending_chart(points: Sequence[Point], title: str) -> Chart | None:
    """Spending (ε) over time as steps, with the limit's steps dashed above it (None
    when there is no point to draw)."""
    if not points:
        return None
    start, end = points[0].time, points[-1].time
    span = max((end - start).total_seconds(), 1.0)
    top = max(max(p.spent for p in points), max(p.limit or 0.0 for p in points), 1e-9)

    def x(i: int) -> float:
        return SVG.left + (points[i].time - start).total_seconds() / span * (
            SVG.width - SVG.left - SVG.right
        )

    def y(value: float) -> float:
        return SVG.top + (1 - value / (top * 1.05)) * (SVG.height - SVG.top - SVG.bottom)

    limits = [(x(i), y(p.limit)) for i, p in enumerate(points) if p.limit is not None]
    dots = tuple(
        Dot(
            f"{x(i):.1f}",
            f"{y(p.spent):.1f}",
            f"{when(p.time)} UTC: spent ε={number(p.spent)}"
            + ("" if p.limit is None else f" of {number(p.limit)}"),
        )
        for i, p in enumerate(points)
    )
    last = points[-1]
    summary = f"{title}: spent ε={number(last.spent)}" + (
        "" if last.limit is None else f" of {number(last.limit)}"
    )
    return Chart(
        summary=summary,
        spent=_steps([(x(i), y(p.spent)) for i, p in enumerate(points)]),
        limits=_steps(limits),
        dots=dots,
        top=f"{y(top) + 4:.1f}",
        top_value=number(top),
        start=when(start),
        end=when(end),
    )


def _steps(points: list[tuple[float, float]]) -> str:
    """A step line through ``points``: each value holds until the next point's time."""
    out: list[str] = []
    for i, (px, py) in enumerate(points):
        if i:
            out.append(f"{px:.1f},{points[i - 1][1]:.1f}")
        out.append(f"{px:.1f},{py:.1f}")
    return " ".join(out)
