"""How accurate each noisy cell is, in words a reader can act on.

The gate sends a 95% interval per cell (a rank radius per quantile). Shown
bare, a cell whose interval spans most of what its bounds allow looks like a
fact ("0", "50000") when it is mostly noise; a quantile's "±1584.72 ranks"
means nothing next to a group of a few hundred values. So each cell gets a
verdict here: its interval (or, for a quantile, the range of percentiles its
rank radius allows, using a noisy count of the same group when the query has
one) and whether noise dominates it. Everything is post-processing of what
the gate released: nothing here costs privacy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DOMINANT_SHARE = 0.5
"""An average whose interval covers at least this share of its bounds says little."""
QUANTILE_DOMINANT_SHARE = 0.9
"""A quantile that may sit anywhere in this share of its group's percentiles says little."""


@dataclass(frozen=True)
class CellAccuracy:
    """One noisy cell's accuracy: short text, a tooltip, and the verdict."""

    short: str
    """``[lo, hi]``, or ``p20–p80`` for a quantile: shown next to the value on demand."""
    tip: str
    half_width: float | None
    """For ``value ± half-width``; None for a quantile."""
    dominated: bool


def cell_accuracy(
    reply: dict[str, Any], column: int, row: int, fmt: Any, percent: str
) -> CellAccuracy | None:
    """The accuracy of ``rows[row][column]``, or None for a key or an unknown interval."""
    info = _column_info(reply, column)
    if info is None:
        return None
    value = reply["rows"][row][column]
    if "rank_radius" in info:
        return _quantile(reply, info, row, fmt, percent)
    intervals = info.get("intervals") or []
    pair = intervals[row] if row < len(intervals) else None
    if not pair or not _number(value) or not all(_number(p) for p in pair):
        return None
    lo, hi = float(pair[0]), float(pair[1])
    short = f"[{fmt(pair[0])}, {fmt(pair[1])}]"
    tip = f"{percent} interval {short}"
    if info.get("interval") == "normal approximation":  # randomized response, debiased
        tip += ", a normal approximation"
    span = value_range(reply, info)
    if span is not None:
        dominated = hi - lo >= DOMINANT_SHARE * (span[1] - span[0]) > 0
        why = f"it covers most of the declared bounds [{fmt(span[0])}, {fmt(span[1])}]"
    else:
        dominated = (hi - lo) / 2 >= abs(float(value)) and hi > lo
        why = "the noise is as large as the value"
    if dominated:
        tip += f": noise dominates ({why}), so this value says little"
    half = max(hi - float(value), float(value) - lo, 0.0)
    return CellAccuracy(short, tip, half, dominated)


def value_range(reply: dict[str, Any], info: dict[str, Any]) -> tuple[float, float] | None:
    """The bounds an average's value lies in: those of its ``SUM(x)`` when the column is
    made of ``SUM(x)`` and ``COUNT(x)`` of the same ``x`` (what ``AVG(x)`` is made of)."""
    measured = info.get("measurements") or []
    if len(measured) != 2:
        return None
    sums = [m for m in measured if m.upper().startswith("SUM(")]
    counts = [m for m in measured if m.upper().startswith("COUNT(")]
    if len(sums) != 1 or len(counts) != 1 or sums[0][4:] != counts[0][6:]:
        return None
    for step in reply.get("plan") or []:
        bounds = step.get("bounds")
        if step.get("aggregate") == sums[0] and bounds and all(_number(b) for b in bounds):
            return float(bounds[0]), float(bounds[1])
    return None


def _quantile(
    reply: dict[str, Any], info: dict[str, Any], row: int, fmt: Any, percent: str
) -> CellAccuracy:
    radius = math.ceil(float(info["rank_radius"]))
    level = float(info.get("level", 0.5))
    count = _group_count(reply, row)
    if count is None or count <= 0:
        short = f"±{radius} ranks"
        tip = (
            f"{percent}: its rank is within ±{radius} of the {fmt(level)}-quantile's, "
            "ties aside (add COUNT(*) to the query to see this as percentiles)"
        )
        return CellAccuracy(short, tip, None, False)
    low = max(0.0, level - radius / count)
    high = min(1.0, level + radius / count)
    short = f"p{low * 100:.0f}–p{high * 100:.0f}"
    tip = (
        f"{percent}: between the {_ordinal(low)} and {_ordinal(high)} percentile of the "
        f"group's ≈{fmt(count)} values (rank within ±{radius} of the "
        f"{fmt(level)}-quantile's, ties aside)"
    )
    dominated = high - low >= QUANTILE_DOMINANT_SHARE
    if dominated:
        tip += ": noise dominates, this could be almost any value of the group"
    return CellAccuracy(short, tip, None, dominated)


def _group_count(reply: dict[str, Any], row: int) -> float | None:
    """A noisy count of the row's group from the same reply: a column measured by a
    single ``COUNT``."""
    columns = (reply.get("accuracy") or {}).get("columns") or []
    for index, info in enumerate(columns):
        measured = (info or {}).get("measurements") or []
        if len(measured) == 1 and measured[0].upper().startswith("COUNT("):
            value = reply["rows"][row][index]
            return float(value) if _number(value) else None
    return None


def _column_info(reply: dict[str, Any], column: int) -> dict[str, Any] | None:
    columns = (reply.get("accuracy") or {}).get("columns") or []
    return columns[column] if column < len(columns) else None


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _ordinal(share: float) -> str:
    n = round(share * 100)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
