"""The dry run's plan as tables a newcomer can read.

Each noisy aggregate's row says what it costs in the unit the footer uses
(ε; ρ only under zCDP, where ρ is what adds up), and its noise's 95%
half-width (a quantile's rank radius). Then one row per output column, as the
gate states it (the plan's steps of kind ``output``, ``gate/sql/summary.py``):
its expected 95% error in its own units, at stated group sizes where it
depends on the group's size (averages, variances, quantiles: not known before
the query runs), and the group size under which noise dominates it. Nothing
here reads a measurement's label: every number is the gate's. The headers
explain the jargon on hover.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from dpmagic.display.cells import ALPHA, MAY_DOMINATE
from dpmagic.display.render import budget_number
from dpmagic.protocol import Cost, PlanKey, PlanStep

HEADERS = (
    ("aggregate", "what the gate measures with noise (an AVG is a SUM over a COUNT)"),
    ("bounds", "each value is clamped into these declared bounds first, so one person's "
               "influence is limited"),
    ("sensitivity", "the most one privacy unit (e.g. a patient, with all their rows) can "
                    "change this aggregate: the noise is scaled to it"),
    ("mechanism", "the OpenDP noise distribution (Laplace for ε, Gaussian for ρ/δ); the "
                  "exponential mechanism picks a quantile among candidates"),
    ("scale", "the noise's scale: larger means noisier"),
    ("cost", "the privacy budget this aggregate spends"),
    ("95% error ±", "95% of the time the noise is within this; for a quantile, the rank "
                    "radius (the column's error, in its own units, is in the table below)"),
    ("keys", "the groups: public values come from the policy, never from the data"),
)  # fmt: skip
OUTPUT_HEADERS = (
    ("column", "an output column of the query, and what it is computed from"),
    ("range", "the values it can take, from the declared bounds: noise dominates a value "
              "whose interval covers at least half of it"),
    ("expected 95% error", "in the column's own units; for an average, a variance or a "
                           "quantile it depends on the group's size, so it is given for "
                           "groups of stated sizes; a quantile's width in units depends on "
                           "how the values spread, so it is given as the band of its group's "
                           "percentiles its interval spans (each reply gives the interval in "
                           "the column's units)"),
    ("noise may dominate", "the group size under which noise can dominate this column, at "
                           "the least favourable values its bounds allow (docs/accuracy.md, "
                           "'When noise dominates')"),
)  # fmt: skip
OUTPUT = "output"


def plan_rows(plan: list[PlanStep], zcdp: bool, fmt: Any) -> list[list[str]]:
    """One row per noisy aggregate of the plan."""
    return [_step_row(step, zcdp, fmt) for step in plan if step.kind != OUTPUT]


def output_rows(plan: list[PlanStep], fmt: Any) -> list[list[str]]:
    """One row per output column the gate judged (its plan's steps of kind ``output``)."""
    rows = []
    for step in plan:
        if step.kind != OUTPUT:
            continue
        span = step.range
        rows.append(
            [
                f"{step.column or ''} = {step.aggregate}",
                f"[{fmt(span[0])}, {fmt(span[1])}]" if span else "",
                _expected(step, fmt),
                _below(step),
            ]
        )
    return rows


def dominance_warnings(plan: list[PlanStep]) -> list[str]:
    """What the dry run warns of before anything is spent: each output column noise will
    dominate in groups under a size."""
    sizes = [
        f"{step.column} in groups under {step.dominated_below:,} rows"
        for step in plan
        if step.kind == OUTPUT and step.dominated_below is not None and step.dominated_below > 1
    ]
    return [f"{MAY_DOMINATE}: " + "; ".join(sizes)] if sizes else []


def _expected(step: PlanStep, fmt: Any) -> str:
    if step.half_width is not None:
        return f"±{fmt(step.half_width)}"
    if step.half_width_at:
        return ", ".join(
            f"±{fmt(at.half_width)} for a group of {at.rows:,} rows" for at in step.half_width_at
        )
    if step.percentiles_at:
        return ", ".join(
            f"p{at.band.lower * 100:.0f}–p{at.band.upper * 100:.0f} for a group of {at.rows:,} rows"
            for at in step.percentiles_at
        )
    return "per cell (an expression of several aggregates)"


def _below(step: PlanStep) -> str:
    below = step.dominated_below
    if below is not None:
        return f"in groups under {below:,} rows" if below > 1 else "never"
    if step.rule == "zero" and step.half_width is not None:
        return "near 0, at any size"
    return "judged per cell"


def _step_row(step: PlanStep, zcdp: bool, fmt: Any) -> list[str]:
    bounds = step.bounds
    sensitivity = "" if step.sensitivity is None else fmt(step.sensitivity)
    return [
        step.aggregate,
        f"[{fmt(bounds[0])}, {fmt(bounds[1])}]" if bounds else "",
        f"{sensitivity} {step.norm or ''}".strip(),
        step.mechanism or "",
        _or_blank(step.scale, fmt),
        _step_cost(step, zcdp),
        _error(step, fmt),
        ", ".join(_key_text(k, step) for k in step.keys or []),
    ]


def _step_cost(step: PlanStep, zcdp: bool) -> str:
    """A step's cost as every amount is shown (``render.budget_number``, rounded up)."""
    cost = step.cost or Cost(epsilon=step.epsilon or 0.0, delta=0.0)
    if zcdp and cost.rho is not None:
        return f"ρ={budget_number(cost.rho, up=True)}"
    text = f"ε={budget_number(cost.epsilon, up=True)}"
    return text + (f", δ={budget_number(cost.delta, up=True)}" if cost.delta else "")


def _error(step: PlanStep, fmt: Any) -> str:
    if step.kind == "quantile" or step.mechanism == "exponential":
        radius = step.rank_radius or rank_radius(step)
        return f"±{math.ceil(radius)} ranks" if radius is not None else "in ranks"
    return _or_blank(step.accuracy, fmt)


def rank_radius(step: PlanStep, alpha: float = ALPHA) -> float | None:
    """``scale · ln(candidates / alpha) / d``, d the denominator of the level q
    (docs/accuracy.md, "Accuracy of quantiles"), when the step gives its ``level``
    (a gate that sent no ``rank_radius``); never read from the aggregate's text."""
    if step.level is None or not step.scale or not step.candidates:
        return None
    denominator = Fraction(str(step.level)).limit_denominator(10_000).denominator
    return step.scale * math.log(step.candidates / alpha) / denominator


def _key_text(key: PlanKey, step: PlanStep) -> str:
    """A public key with how many values it has; a private one with how it is chosen."""
    if key.public:
        return f"{key.column} ({key.values} public)"
    if step.kind == "partition_selection":
        return f"{key.column} (private: kept if noisy units ≥ {step.threshold})"
    return f"{key.column} (private: DP partition selection)"


def _or_blank(value: Any, fmt: Any) -> str:
    return "" if value is None else fmt(value)
