"""What a reply says about contribution bounding: the bounds every answer is over,
and, when asked for, the noisy bounding report.

Every answer is over *bounded* data: each unit keeps at most so many rows (and
groups), values are clamped into bounds, and what lies beyond is left out or
moved. No peer says so in its answers; a user who reads a count of 80,000
with a tight interval while the table has 100,000 rows is misled by an
interval that is only about the noise. ``statement`` says, for every reply
and every dry run, which bounds the query is answered under, from the plan
alone (public). ``report`` adds, when the request buys it with a share of its
budget (``dp/left_out.LeftOut``), a noisy count of the rows the bounds left out and
of the units they belonged to, with their intervals.
"""

from __future__ import annotations

from typing import SupportsInt

from dpmagic.gate.dp.mechanisms import Noise
from dpmagic.gate.failures import required
from dpmagic.gate.sql.aggregates.parts import Variance
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.ranks import Ranked, RowLevel, Window
from dpmagic.gate.sql.summary import stated_cost
from dpmagic.protocol import Bounding, Clamp, LeftOut, NoisyCount


def statement(plan: Plan) -> Bounding:
    """The bounds this query is answered under, and a sentence that says them."""
    unit = plan.dataset.privacy_unit
    b = plan.bounding
    out = Bounding(unit=unit)
    parts: list[str] = []
    if isinstance(b, Ranked):
        out.rows_per_unit = b.rows
        parts.append(
            f"at most {b.rows} row{'s' if b.rows != 1 else ''} of each {unit} "
            "(a random choice fixed at load); its other rows are left out"
        )
    elif isinstance(b, Window):
        out.rows_per_group, out.groups_per_unit = b.rows, b.groups
        groups = f" in at most {b.groups} group{'s' if b.groups != 1 else ''}" if plan.keys else ""
        parts.append(
            f"at most {b.rows} row{'s' if b.rows != 1 else ''} of each {unit} per group{groups} "
            "(a random choice); its other rows are left out"
        )
    elif isinstance(b, RowLevel):
        parts.append("each row is its own unit; no row is left out")
    clamps = _clamps(plan)
    out.clamps = [Clamp(aggregate=label, bounds=[lo, hi]) for label, (lo, hi) in clamps]
    if clamps:
        parts.append(
            "values clamped: "
            + "; ".join(f"{label} into [{_num(lo)}, {_num(hi)}]" for label, (lo, hi) in clamps)
        )
    out.text = "Over bounded data: " + "; ".join(parts) + "."
    return out


def report(plan: Plan, exact: tuple[object, ...], alpha: float) -> LeftOut:
    """The bounding report: the exact left-out rows and units (the first row of
    ``rewrite.left_out``'s SQL) noised once each, with their intervals."""
    left = required(plan.left_out, "the plan's bounding report")
    rows, units = (_count(v) for v in exact[:2])
    return LeftOut(
        rows=_noisy(rows, left.rows, alpha),
        units=_noisy(units, left.units, alpha),
        cap=left.cap,
        share=left.share,
        cost=stated_cost(left.cost),
        alpha=alpha,
        text=(
            f"Rows the bounds left out, each {plan.dataset.privacy_unit}'s counted up to "
            f"{left.cap}, and the {plan.dataset.privacy_unit}s they belong to "
            f"(noisy, {1 - alpha:.0%} intervals)."
        ),
    )


def _count(value: object) -> int:
    """One count of the report's row: an integer (a Decimal or a numpy integer from an
    engine converts alike), or NULL when no unit had a row, which is 0."""
    if value is None:
        return 0
    if not isinstance(value, SupportsInt):
        raise RuntimeError("internal error: the bounding report's count is not a number")
    return int(value)


def _noisy(exact: int, noise: Noise, alpha: float) -> NoisyCount:
    """A noisy count with its interval, neither below 0: a count of rows or units left
    out is never negative, so raising the noisy value and the interval's ends to 0 is
    post-processing that only moves them towards the truth (an interval that held it
    still does)."""
    value = exact + noise.sample(1)[0]
    half = noise.half_width(alpha)
    return NoisyCount(value=max(value, 0), interval=[max(value - half, 0), max(value + half, 0)])


def _clamps(plan: Plan) -> list[tuple[str, tuple[float, float]]]:
    """Each aggregate's clamp, as written: sums, averages, variances and quantiles."""
    out: list[tuple[str, tuple[float, float]]] = []
    by_name = {m.name: m for m in plan.measurements}
    selections = {s.name: s for s in plan.selections}
    for agg in plan.checked.aggregates:
        parts = plan.parts.get(agg.name)
        if parts is None:
            continue
        if isinstance(parts, Variance):  # its sums are of distances to the centre
            centred = by_name[parts.centred]
            lo, hi = centred.bounds.lo + parts.centre, centred.bounds.hi + parts.centre
            out.append((agg.label, (lo, hi)))
            continue
        for name in parts.names:
            m = by_name.get(name)
            if m is not None and m.clamp is not None:
                out.append((agg.label, (m.clamp.lo, m.clamp.hi)))
                break
            s = selections.get(name)
            if s is not None:
                out.append((agg.label, (s.grid.lo, s.grid.hi)))
                break
    return out


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) and not value.is_integer() else f"{int(value)}"
