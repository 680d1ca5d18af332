"""How accurate each noisy cell is, in words a reader can act on.

The gate decides, for every released cell, its 95% interval (a quantile's
band of the group's percentiles) and whether noise dominates it, from the
plan and the noisy values (``dpmagic/gate/sql/dominance.py``; the rule is
in docs/accuracy.md, "When noise dominates"). This module only puts those
facts into words: it never reads a measurement's label, never re-derives a
verdict. A verdict of ``None`` (the gate cannot tell, or an older gate sent
none) reads "noise may dominate".
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from dpmagic.protocol import ColumnAccuracy

DOMINATES = "noise dominates"
MAY_DOMINATE = "noise may dominate"
ALPHA = 0.05
"""The level of a reply's intervals when it does not say (the gate's default; a mock
or dry-run reply made on this side states it with this)."""


@dataclass(frozen=True)
class CellAccuracy:
    """One noisy cell's accuracy: short text, a tooltip, and the gate's verdict."""

    short: str
    """``[lo, hi]`` (a quantile's too), or ``p45–p55`` for a quantile a gate sent no
    interval for: shown beside the value."""
    tip: str
    half_width: float | None
    """For ``value ± half-width``; None for a quantile, an unknown interval, or a value
    at an end of its interval (a count released as 0 from a negative noisy value:
    ``0 [0, 22]``, which ``0 ± 22`` would misstate as reaching below 0)."""
    verdict: bool | None
    """The gate's: True (noise dominates), False, None (it may: the gate cannot tell)."""
    judged: str | None = None
    """Where the gate flagged the cell on a wider interval than ``short`` (which alone
    would not have been flagged): that interval, ``judged on [lo, hi]``, or that the
    group may be empty. Shown with the flag, so the flag and the interval beside it
    never seem to disagree."""

    @property
    def dominated(self) -> bool:
        """Whether the cell must be read as noise: it dominates, or may."""
        return self.verdict is not False

    @property
    def flag(self) -> str | None:
        """The words shown beside a cell that must be read as noise."""
        if self.verdict is None:
            return MAY_DOMINATE
        if not self.verdict:
            return None
        return f"{DOMINATES}, {self.judged}" if self.judged else DOMINATES


def cell_accuracy(
    info: ColumnAccuracy, value: Any, row: int, fmt: Any, percent: str
) -> CellAccuracy:
    """The accuracy of ``value``, the cell of ``row`` in a noisy column whose facts (its
    per-cell lists as lists) are ``info``."""
    verdict = _at(info.noise_dominates, row, missing=None)
    if info.rule == "percentiles" or info.rank_radius is not None:
        return _quantile(info, row, verdict, fmt, percent, value)
    pair = _at(info.intervals, row, missing=None)
    known = bool(pair) and _number(value) and all(_number(p) for p in pair)
    if known:
        lo, hi = float(pair[0]), float(pair[1])
        short = f"[{fmt(pair[0])}, {fmt(pair[1])}]"
        tip = f"{percent} interval {short}"
        if info.interval == "normal approximation":  # randomized response, debiased
            tip += ", a normal approximation"
        at_end = hi > lo and float(value) in (lo, hi)
        half: float | None = None if at_end else max(hi - float(value), float(value) - lo, 0.0)
    else:
        short, tip, half = "[?]", f"no {percent} interval is known for this cell", None
    if info.noise_dominates is None:
        tip += f": {MAY_DOMINATE} (a reply from an older gate, which did not judge it)"
    elif verdict is None:
        tip += f": {MAY_DOMINATE}, the gate cannot tell how much"
    elif verdict:
        wider = _judged_wider(info, row)
        if wider is not None:
            judged, why = _wider_words(info, wider, fmt)
            tip += f": {DOMINATES}, {why}, so this value says little"
            return CellAccuracy(short, tip, half, verdict, judged)
        tip += f": {DOMINATES} ({_why(info, fmt)}), so this value says little"
    return CellAccuracy(short, tip, half, verdict)


def _judged_wider(info: ColumnAccuracy, row: int) -> tuple[Any, Any] | None:
    """The interval the gate judged ``row`` on and the least group size it was judged
    at, where it flagged the cell on a wider interval than the one shown (the
    column's ``judged_wider``, its rows in ascending order); None elsewhere."""
    wider = info.judged_wider
    if wider is None:
        return None
    at = bisect_left(wider.rows, row)
    if at == len(wider.rows) or wider.rows[at] != row:
        return None
    return _at(wider.intervals, at, None), _at(wider.least_rows, at, None)


def _wider_words(info: ColumnAccuracy, wider: tuple[Any, Any], fmt: Any) -> tuple[str, str]:
    """What is shown with the flag, and the tooltip's why, for a cell the gate judged on
    a wider interval than the one shown."""
    interval, least = wider
    span = info.range if info.rule == "range" else None
    covers = (
        f"it covers at least half of the range [{fmt(span[0])}, {fmt(span[1])}]"
        if span
        else "it holds a value the noise would dominate"
    )
    if interval is None or least is None:
        return (
            "its group may be empty",
            "judged as its group's noisy count allows: that count's interval reaches "
            "below one row, so the group may be empty and the value anything its noise "
            "can make",
        )
    judged = f"[{fmt(interval[0])}, {fmt(interval[1])}]"
    rows = f"{math.floor(float(least)):,}"
    return (
        f"judged on {judged}",
        f"judged on {judged}: the interval shown, widened to what this cell's noise can "
        f"give in a group of {rows} rows, the fewest its noisy count's interval allows "
        f"(an interval can come out narrow by luck); {covers}",
    )


def _why(info: ColumnAccuracy, fmt: Any) -> str:
    span = info.range
    if info.rule == "range" and span:
        return f"it covers at least half of the range [{fmt(span[0])}, {fmt(span[1])}]"
    return "the noise may be as large as the value"


def _quantile(
    info: ColumnAccuracy, row: int, verdict: bool | None, fmt: Any, percent: str, value: Any
) -> CellAccuracy:
    """A quantile: the band of its group's percentiles it lies at, as the gate judged
    it from a noisy count of the values it was chosen from."""
    level = 0.5 if info.level is None else info.level
    band = _at(info.percentiles, row, missing=None)
    pair = _at(info.intervals, row, missing=None)
    what = f"the {fmt(level)}-quantile"
    if band:
        low, high = float(band[0]), float(band[1])
        short = f"p{low * 100:.0f}–p{high * 100:.0f}"
        tip = (
            f"between the {_ordinal(low)} and {_ordinal(high)} percentile of its group's "
            f"values, where {what} is the {_ordinal(level)}"
        )
        half = None
        if pair and all(_number(p) for p in pair):
            short = f"[{fmt(pair[0])}, {fmt(pair[1])}]"
            ends = f"{percent} interval {short}, for its group's true {fmt(level)}-quantile"
            tip = f"{ends}; the value lies {tip}"
            if _number(value):
                half = max(float(pair[1]) - value, value - float(pair[0]), 0.0)
        else:
            tip = f"{percent}: " + tip
        if verdict:
            tip += (
                f": {DOMINATES}, this could be almost any value of the group"
                if high - low < 1
                else f": {DOMINATES}, the group may be empty or nearly so"
            )
        return CellAccuracy(short, tip, half, verdict)
    # A stored reply of a gate that sent neither (it judged quantiles by a count the
    # query had to hold): nothing to show but that it may be noise.
    tip = f"no {percent} interval is known for this cell: {MAY_DOMINATE}"
    return CellAccuracy("[?]", tip, None, verdict)


def _at(values: Any, row: int, missing: Any) -> Any:
    if not isinstance(values, list) or row >= len(values):
        return missing
    return values[row]


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
