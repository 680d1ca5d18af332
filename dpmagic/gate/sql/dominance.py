"""Whether noise dominates a released cell: one rule, which the release pass applies to
each released column (``judged``) and the dry run states (``judging_rule``).

A reader must not take noise for a finding, so every noisy cell of a reply
carries a verdict, computed here from the plan and the noisy values only
(post-processing: it costs no privacy), and the notebook shows it as it is;
the rule is stated once, in docs/accuracy.md ("When noise dominates"):

- a value with a declared range (an average, a variance, a standard
  deviation, or one of them rounded or scaled by a constant): noise dominates
  when its interval covers at least half of that range (``range_rule``). The
  interval's width goes as one over the group's size, which the gate knows
  only from a noisy count: so the width is judged at the smallest size the
  count's interval allows (``stretch``), and a group that may be empty is
  dominated. A bare average or variance is judged by the larger of that and
  the width the plan's 95% error gives at that size at the least favourable
  values its bounds allow (``expected_width``): a draw whose interval came out
  narrow by luck is judged by what its noise can do;
- counts, sums and anything else computed from noisy values: noise dominates
  a true value ``t`` when the noise's 95% half-width ``h`` is at least
  ``|t|``; the gate sees ``t`` only through its interval, so it flags a cell
  whose interval holds a value the noise would dominate, i.e. whose distance
  from 0 is at most its half-width (``zero_rule``: ``|v| ≤ 2h`` for a
  symmetric interval). Whenever the interval holds the truth, a truth the
  noise dominates is then flagged. A count, or a sum of values that cannot be
  negative, below 0 is noise whatever its size (``signed_rule``). An average
  or variance with a constant added (``AVG(age) - 30``, scaled or not) is
  judged on its interval widened as a bare one's is (``Floor``): its own
  interval can come out narrow by luck too;
- a quantile: from a noisy count of the values it was chosen from (the
  query's own ``COUNT`` of the same argument, in the same group), the band of
  the group's percentiles its rank radius allows (``percentile_band``);
  noise dominates when the band covers at least half of the group, or the
  count's interval reaches below one value, or (but for MIN and MAX, whose
  intervals end at a bound by construction) its interval in units covers at
  least half of its grid's range. Without such a count the gate cannot tell,
  but for that last case: the verdict is ``None``, shown as "noise may
  dominate".

A cell with no interval (an expression whose interval is unknown, such as a
ratio whose denominator's interval reaches 0) gets ``None`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from sqlglot import exp

from dpmagic.gate.dp.levels import band_level
from dpmagic.gate.sql.aggregates.parts import Avg, Trimmed, Variance
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.noise import Noisy
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.plan_types import Measurement, Plan, Selection
from dpmagic.gate.sql.trees import unparen
from dpmagic.protocol import JudgedWider

DOMINANT_SHARE = 0.5
"""Noise dominates a value whose interval covers at least this share of its range."""


def zero_rule(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per cell, whether ``[lo, hi]`` holds a value whose magnitude is at most the
    interval's half-width: its distance from 0 is at most that half-width. A
    point interval (no noise) is never dominated."""
    half = (hi - lo) / 2
    distance = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
    return (hi > lo) & (distance <= half)


def signed_rule(value: np.ndarray, half: float, sign: int) -> np.ndarray:
    """``zero_rule`` for ``value ± half`` of a quantity whose sign is known (``sign``
    +1: never negative, −1: never positive, 0: either): a value on the wrong side of
    0 is noise, however far."""
    if not half > 0:
        return np.zeros(len(value), dtype=bool)
    if sign > 0:
        return value <= 2 * half
    if sign < 0:
        return value >= -2 * half
    return np.abs(value) <= 2 * half


def range_rule(
    lo: np.ndarray,
    hi: np.ndarray,
    low: float,
    high: float,
    stretch: np.ndarray | None = None,
    floor: np.ndarray | None = None,
) -> np.ndarray:
    """Per cell, whether ``[lo, hi]``, its width times ``stretch`` (the group's noisy
    size over the least its count's interval allows; ``inf`` where that is below one
    row), or ``floor`` where larger (``expected_width``), covers at least
    ``DOMINANT_SHARE`` of ``[low, high]``."""
    if not high > low:
        return np.zeros(len(lo), dtype=bool)
    return judged_width(lo, hi, stretch, floor) >= DOMINANT_SHARE * (high - low)


def expected_width(
    error: float, least: np.ndarray, lo: np.ndarray, hi: np.ndarray, root: bool
) -> np.ndarray:
    """The width of a 95% interval the plan's error allows in a group of ``least`` rows
    (``error/least`` each side; ``inf`` below one row), at the least favourable values
    the bounds allow (``expected``): a cell whose own interval came out narrower, by a
    lucky draw, is judged by this. A standard deviation's (``root``) is the square
    root's of its variance's interval around the cell's middle squared."""
    with np.errstate(divide="ignore", invalid="ignore"):
        half = np.where(least >= 1, error / np.maximum(least, 1.0), np.inf)
        if not root:
            return 2 * half
        v = ((lo + hi) / 2) ** 2
        return np.sqrt(v + half) - np.sqrt(np.maximum(v - half, 0.0))


def count_stretch(counts: np.ndarray, half: float) -> np.ndarray:
    """``n / (n − half)`` per noisy count ``n`` whose interval reaches down to ``n − half``;
    ``inf`` where that is below one row (the group may be empty)."""
    least = counts - half
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(least >= 1, np.maximum(counts, 1.0) / np.maximum(least, 1.0), np.inf)


def percentile_band(
    level: float, radius: float, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The band of percentiles ``[a, b]`` a quantile's rank radius allows in groups of
    at least ``counts`` values (a count's lower end), and whether noise dominates:
    the band covers at least ``DOMINANT_SHARE`` of the group, or the group may hold
    fewer than one value (then the band is all of it, ``[0, 1]``)."""
    known = counts >= 1
    n = np.where(known, counts, 1.0)
    a = np.where(known, np.maximum(0.0, level - radius / n), 0.0)
    b = np.where(known, np.minimum(1.0, level + radius / n), 1.0)
    return a, b, (~known) | (b - a >= DOMINANT_SHARE)


def verdicts(flags: np.ndarray, unknown: np.ndarray | None = None) -> list[bool | None]:
    """The JSON list: ``True``/``False`` per cell, ``None`` where ``unknown``."""
    out: list[bool | None] = flags.astype(bool).tolist()
    if unknown is not None:
        for i in np.flatnonzero(unknown).tolist():
            out[i] = None
    return out


ErrorOf = Callable[[Plan, Any, float], float]
"""A kind's plan's 95% error at a level (``expected``'s ``average_error`` or
``variance_error``, a trimmed mean's), as ``error(plan, parts, alpha)``."""
Expected = tuple[ErrorOf, Avg | Variance | Trimmed, bool]
"""A bare aggregate's error, its parts, and whether it is a square root."""
Ranged = tuple[float, float, Measurement | None, Expected | None]
"""What the range rule reads: the range, the group's count, and the error it floors at."""
Bare = tuple[Measurement, int]
"""What the zero rule reads of a bare count or sum: its measurement and sign."""


@dataclass(frozen=True)
class Floor:
    """An average or variance under arithmetic with constants, judged by the zero rule:
    the count of its group, its plan's 95% error (``error(plan, parts, alpha)``, as
    ``expected``'s) and the factor it is scaled by. Its interval is widened to what
    its noise can do, as a bare one's is by the range rule."""

    count: Measurement
    error: ErrorOf
    parts: Avg | Variance | Trimmed
    scale: float


Origins = dict[str, tuple[tuple[Selection, ...], np.ndarray]]
"""Per quantile selection whose cells show another level's draw (``release.in_order``):
the selections of its column, by level, and per partition the index of the one whose
draw the cell shows."""


Rule = tuple[str, object]
"""How noise dominance is judged (``dominance``): ``("range", (lo, hi, count, floor))``
(the count of the value's group, or None; ``floor`` an average's or variance's
``(error, parts, square_root)``, ``expected``, or None under scaling),
``("percentiles", selection)``, ``("zero", (measurement, sign))`` for a bare count
or sum, ``("zero", Floor)`` for an average or variance a constant was added to, and
``("zero", None)`` otherwise."""


def judging_rule(plan: Plan, node: exp.Expression) -> Rule:
    """The rule a released expression is judged by: a value with a declared range (an
    average, a variance, a standard deviation, or one of them rounded, cast or scaled
    by a constant) by its range, a bare quantile (or one rounded, cast or scaled by a
    positive constant) by its percentiles, anything else by the zero rule (a bare
    count or sum with its measurement, judged on its noise's own interval)."""
    if isinstance(node, exp.Paren | exp.Round | exp.Floor | exp.Ceil | exp.TryCast):
        inner = judging_rule(plan, node.this)
        return inner if inner[0] != "zero" else ("zero", _floor(plan, node))
    if isinstance(node, exp.Mul | exp.Div):
        factor, other = _constant(node.expression), node.this
        if factor is None and isinstance(node, exp.Mul):
            factor, other = _constant(node.this), node.expression
        if not factor:
            return "zero", _floor(plan, node)
        factor = 1 / factor if isinstance(node, exp.Div) else factor
        kind, what = judging_rule(plan, other)
        if kind == "range":
            lo, hi, count, _ = cast(Ranged, what)
            return "range", (*sorted((lo * factor, hi * factor)), count, None)
        if kind == "percentiles" and factor > 0:
            return kind, what
        return "zero", _floor(plan, node)
    if not isinstance(node, exp.Column):
        return "zero", _floor(plan, node)
    if node.name not in plan.parts:
        return "zero", None
    name = node.name
    return kind_of(plan.checked.aggregate(name).func).dominance(plan, name, plan.parts[name])


def _floor(plan: Plan, node: exp.Expression) -> Floor | None:
    """``node``'s ``Floor`` where it is an affine function (``affine_factor``) of a
    single average or variance, not a standard deviation (whose interval is not
    linear in its variance's); None otherwise."""
    scale = affine_factor(node)
    names = {n.name for n in node.walk() if isinstance(n, exp.Column) and n.name in plan.parts}
    if not scale or len(names) != 1:
        return None
    (name,) = names
    expected = kind_of(plan.checked.aggregate(name).func).expected(plan, name, plan.parts[name])
    if expected is None or expected[2]:
        return None
    error, parts, _ = expected
    return Floor(plan.measurement(parts.count), error, parts, scale)


def affine_factor(node: exp.Expression) -> float | None:
    """The factor a single aggregate is scaled by in ``node`` (rounded, cast, a constant
    added or multiplied), or None for anything else."""
    if isinstance(node, exp.Column):
        return 1.0
    if isinstance(node, exp.Paren | exp.Round | exp.Floor | exp.Ceil | exp.TryCast):
        return affine_factor(node.this)
    if isinstance(node, exp.Neg):
        inner = affine_factor(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
        left, right = _constant(node.this), _constant(node.expression)
        if isinstance(node, exp.Add | exp.Sub):
            if right is not None:
                return affine_factor(node.this)
            if left is not None:
                inner = affine_factor(node.expression)
                return None if inner is None else inner * (-1 if isinstance(node, exp.Sub) else 1)
            return None
        if right:
            inner = affine_factor(node.this)
            factor = 1 / right if isinstance(node, exp.Div) else right
            return None if inner is None else inner * factor
        if left is not None and isinstance(node, exp.Mul):
            inner = affine_factor(node.expression)
            return None if inner is None else inner * left
    return None


def _in_own_units(node: exp.Expression) -> bool:
    """Whether an output is an aggregate's value in its own units: the bare aggregate,
    or rounded or cast (not scaled)."""
    while isinstance(node, exp.Paren | exp.Round | exp.Floor | exp.Ceil | exp.TryCast):
        node = node.this
    return isinstance(node, exp.Column)


def _constant(node: exp.Expression) -> float | None:
    node = unparen(node)
    if isinstance(node, exp.Literal) and not node.is_string:
        return float(node.this)
    return None


def judged(
    plan: Plan,
    noisy: Noisy,
    alpha: float,
    node: exp.Expression,
    pids: Sequence[int],
    pairs: list[list[float] | None] | np.ndarray,
    origins: Origins | None = None,
) -> dict[str, object]:
    """The rule a column is judged by and, per cell, whether noise dominates it
    (``dominance``; ``None`` where the gate cannot tell); a quantile's band of
    percentiles too (``origins``: which draw each quantile cell shows, where the
    release sorted them). From the plan and the noisy values only."""
    kind, what = judging_rule(plan, node)
    if kind == "percentiles":
        # Scaled, its interval is in other units than its grid: judged by its band alone.
        in_units = pairs if _in_own_units(node) else [None] * len(pairs)
        origin = (origins or {}).get(what.name)  # type: ignore[attr-defined]
        return _judged_quantile(plan, noisy, alpha, what, pids, in_units, origin)  # type: ignore[arg-type]
    index = np.asarray(pids, dtype=np.intp)
    if kind == "zero" and what is not None and not isinstance(what, Floor):
        # A bare count or sum: its noise's own interval, before a count's floor at 0
        # (a noisy count of -8 is released as 0 [0, 0], and is noise).
        m, sign = cast(Bare, what)
        half = m.noise.half_width(alpha) if m.noise.sensitivity else 0.0
        value = np.asarray(noisy.values[m.name], dtype=float)[index]
        flags = signed_rule(value, half, sign)
        return {"rule": "zero", "noise_dominates": verdicts(flags, ~np.isfinite(value))}
    ends = np.array([p if p is not None else (np.nan, np.nan) for p in pairs], dtype=float)
    ends = ends.reshape(len(pairs), 2)
    lo, hi = ends[:, 0], ends[:, 1]
    unknown = np.isnan(lo) | np.isnan(hi)
    if kind == "range":
        low, high, count, floor = cast(Ranged, what)
        stretch = least = None
        if count is not None:
            stretch, least = _sizes(count, noisy, alpha, index)
        widths = None
        if floor is not None and least is not None:
            error, parts, root = floor
            widths = expected_width(error(plan, parts, alpha), least, lo, hi, root)
        flags = range_rule(lo, hi, low, high, stretch, widths)
        out: dict[str, object] = {
            "rule": "range",
            "range": [low, high],
            "noise_dominates": verdicts(flags, unknown),
        }
        wider = flags & ~range_rule(lo, hi, low, high) & ~unknown
        if least is not None and wider.any():
            width = judged_width(lo, hi, stretch, widths)
            lo_judged, hi_judged = within_range(lo, hi, width, low, high)
            out["judged_wider"] = judged_wider(wider, lo_judged, hi_judged, least)
        return out
    if isinstance(what, Floor):
        shown = zero_rule(lo, hi)
        lo, hi = _widened(plan, noisy, alpha, index, what, lo, hi)
        flags = zero_rule(lo, hi)
        widened: dict[str, object] = {"rule": "zero", "noise_dominates": verdicts(flags, unknown)}
        wider = flags & ~shown & ~unknown
        if wider.any():
            least = _sizes(what.count, noisy, alpha, index)[1]
            widened["judged_wider"] = judged_wider(wider, lo, hi, least)
        return widened
    return {"rule": "zero", "noise_dominates": verdicts(zero_rule(lo, hi), unknown)}


def judged_width(
    lo: np.ndarray, hi: np.ndarray, stretch: np.ndarray | None, floor: np.ndarray | None
) -> np.ndarray:
    """The width ``range_rule`` judges ``[lo, hi]`` by: its own times ``stretch``, or
    ``floor`` where larger; ``inf`` where the group may be empty."""
    width = hi - lo
    if stretch is not None:
        with np.errstate(invalid="ignore"):
            width = np.where(np.isinf(stretch), np.inf, width * stretch)
    if floor is not None:
        width = np.fmax(width, floor)
    return width


def within_range(
    lo: np.ndarray, hi: np.ndarray, width: np.ndarray, low: float, high: float
) -> tuple[np.ndarray, np.ndarray]:
    """An interval ``width`` wide holding ``[lo, hi]`` (itself within ``[low, high]``) as
    the range rule sees it: about ``[lo, hi]``'s middle, moved (never narrowed) to lie
    within the range, or the whole range where ``width`` is not less (or infinite).
    The rule judges a width, not a place; shown as an interval the user reads it as
    one a value could lie in, so it stays within the values the cell can take, and
    covers as much of the range as the width the verdict was judged by."""
    with np.errstate(invalid="ignore"):
        start = np.clip((lo + hi) / 2 - width / 2, low, np.maximum(high - width, low))
        whole = ~(width < high - low)
        return np.where(whole, low, start), np.where(whole, high, start + width)


def judged_wider(
    cells: np.ndarray, lo: np.ndarray, hi: np.ndarray, least: np.ndarray
) -> JudgedWider:
    """The cells (row positions) flagged on a wider interval than the one shown, which
    alone would not have flagged them: for each, that interval (``None`` where it is
    unbounded: the group may be empty; a range rule's is within its range,
    ``within_range``) and the least group size it was judged at
    (the count's interval's lower end; ``None`` below one row). Sent so that the
    notebook can show the interval a flag was judged on, which the user would
    otherwise never see beside a narrower one (``33.06 [19.77, 43.49] noise
    dominates``)."""
    rows = np.flatnonzero(cells)
    finite = np.isfinite(lo[rows]) & np.isfinite(hi[rows])
    intervals = [
        [float(lo[i]), float(hi[i])] if ok else None
        for i, ok in zip(rows.tolist(), finite.tolist(), strict=True)
    ]
    sizes = [float(least[i]) if least[i] >= 1 else None for i in rows.tolist()]
    return JudgedWider(rows=rows.tolist(), intervals=intervals, least_rows=sizes)


def _sizes(
    count: Measurement, noisy: Noisy, alpha: float, index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, ``count_stretch`` of the group's noisy count, and the least size its
    interval allows."""
    half = count.noise.half_width(alpha) if count.noise.sensitivity else 0.0
    counts = np.asarray(noisy.values[count.name], dtype=float)[index]
    return count_stretch(counts, half), counts - half


def _widened(
    plan: Plan,
    noisy: Noisy,
    alpha: float,
    index: np.ndarray,
    floor: Floor,
    lo: np.ndarray,
    hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi]`` widened on both sides to the width the range rule would judge it by
    (its own times ``count_stretch``, or the plan's at the least size, scaled):
    infinite where the group may be empty."""
    stretch, least = _sizes(floor.count, noisy, alpha, index)
    error = abs(floor.scale) * floor.error(plan, floor.parts, alpha)
    width = hi - lo
    with np.errstate(invalid="ignore"):
        judged = np.fmax(np.where(np.isinf(stretch), np.inf, width * stretch),
                         expected_width(error, least, lo, hi, False))  # fmt: skip
    extra = (judged - width) / 2
    return lo - extra, hi + extra


def _judged_quantile(
    plan: Plan,
    noisy: Noisy,
    alpha: float,
    selection: Selection,
    pids: Sequence[int],
    pairs: list[list[float] | None] | np.ndarray,
    origin: tuple[tuple[Selection, ...], np.ndarray] | None = None,
) -> dict[str, object]:
    """A quantile's band of the group's percentiles and verdict, from a noisy count of
    the values it was chosen from (the rank radius and the count's interval each at
    ``levels.band_level``, so the band holds at ``1 − alpha``); ``None`` without one.
    Whatever the band, a quantile whose interval in units covers at least half of its
    grid's range is dominated, as a bounded value is (``range_rule``): the interval's
    ends are chosen with less of the ε than the value (``edges``), and where the group
    is too small for them they fall back to the grid's ends, so a narrow band can sit
    inside an interval that says nothing (``4 [0, 10]``). Not MIN and MAX: one end of
    theirs is always a bound.

    Where the release sorted a column's quantiles (``origin``), a cell showing another
    level's draw has as its band the hull of its own and that draw's: the draw lies in
    its own band at 95%, so the hull holds the value shown, and it spans the cell's
    level too, so its width measures how far from its level the value may be."""
    grid = selection.grid
    ends = np.array([p if p is not None else (np.nan, np.nan) for p in pairs], dtype=float)
    ends = ends.reshape(len(pairs), 2)
    wide = range_rule(ends[:, 0], ends[:, 1], grid.lo, grid.hi) & ~np.isnan(ends[:, 0])
    if not 0 < selection.noise.level < 1:
        # MIN's and MAX's intervals end at a bound by construction (no level lies past
        # 0 or 1), however exact the value: their width says nothing of the noise.
        wide[:] = False
    count = quantile_count(plan, selection)
    if count is None:
        unknown = [None] * len(pids)
        return {"rule": "percentiles", "count": None, "percentiles": unknown,
                "noise_dominates": verdicts(wide, ~wide)}  # fmt: skip
    part = band_level(alpha)
    half = count.noise.half_width(part) if count.noise.sensitivity else 0.0
    counts = np.asarray(noisy.values[count.name], dtype=float)[np.asarray(pids, dtype=np.intp)]
    radius = selection.noise.rank_radius(part)
    a, b, flags = percentile_band(selection.noise.level, radius, counts - half)
    if origin is not None:
        members, came = origin
        index = came[np.asarray(pids, dtype=np.intp)]
        bands = [
            percentile_band(m.noise.level, m.noise.rank_radius(part), counts - half)
            for m in members
        ]
        a = np.minimum(a, np.choose(index, [band[0] for band in bands]))
        b = np.maximum(b, np.choose(index, [band[1] for band in bands]))
        flags = (counts - half < 1) | (b - a >= DOMINANT_SHARE)
    return {
        "rule": "percentiles",
        "count": count.label,
        "percentiles": np.column_stack((a, b)).tolist(),
        "noise_dominates": verdicts(flags | wide),
    }


def quantile_count(plan: Plan, selection: Selection) -> Measurement | None:
    """The query's noisy count of exactly the values ``selection`` is chosen from: a
    ``COUNT`` of the same argument (its own, or the count of an average or variance
    of it), in the same groups. ``COUNT(*)`` does not do: it counts rows whose
    argument is NULL, and a count too high makes the band too narrow."""
    arg = selection.arg.sql(dialect=DIALECT)
    for m in plan.measurements:
        if m.kind == MeasureKind.COUNT and m.arg is not None and m.arg.sql(dialect=DIALECT) == arg:
            return m
    return None
