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


def plan_rows(plan: list[dict[str, Any]], zcdp: bool, fmt: Any) -> list[list[str]]:
    """One row per noisy aggregate of the plan."""
    return [_step_row(step, zcdp, fmt) for step in plan if step.get("kind") != OUTPUT]


def output_rows(plan: list[dict[str, Any]], fmt: Any) -> list[list[str]]:
    """One row per output column the gate judged (its plan's steps of kind ``output``)."""
    rows = []
    for step in plan:
        if step.get("kind") != OUTPUT:
            continue
        span = step.get("range")
        rows.append(
            [
                f"{step.get('column', '')} = {step.get('aggregate', '')}",
                f"[{fmt(span[0])}, {fmt(span[1])}]" if span else "",
                _expected(step, fmt),
                _below(step),
            ]
        )
    return rows


def dominance_warnings(plan: list[dict[str, Any]]) -> list[str]:
    """What the dry run warns of before anything is spent: each output column noise will
    dominate in groups under a size."""
    sizes = []
    for step in plan:
        if step.get("kind") != OUTPUT:
            continue
        below = step.get("dominated_below")
        if isinstance(below, int) and below > 1:
            sizes.append(f"{step.get('column')} in groups under {below:,} rows")
    return [f"{MAY_DOMINATE}: " + "; ".join(sizes)] if sizes else []


def _expected(step: dict[str, Any], fmt: Any) -> str:
    if step.get("half_width") is not None:
        return f"±{fmt(step['half_width'])}"
    at = step.get("half_width_at")
    if at:
        return ", ".join(f"±{fmt(error)} for a group of {n:,} rows" for n, error in at)
    bands = step.get("percentiles_at")
    if bands:
        return ", ".join(
            f"p{a * 100:.0f}–p{b * 100:.0f} for a group of {n:,} rows" for n, (a, b) in bands
        )
    return "per cell (an expression of several aggregates)"


def _below(step: dict[str, Any]) -> str:
    below = step.get("dominated_below")
    if isinstance(below, int):
        return f"in groups under {below:,} rows" if below > 1 else "never"
    if step.get("rule") == "zero" and step.get("half_width") is not None:
        return "near 0, at any size"
    return "judged per cell"


def _step_row(step: dict[str, Any], zcdp: bool, fmt: Any) -> list[str]:
    bounds = step.get("bounds")
    cost = step.get("cost") or {"epsilon": step.get("epsilon")}
    keys = step.get("keys") or []
    return [
        str(step.get("aggregate", "")),
        f"[{fmt(bounds[0])}, {fmt(bounds[1])}]" if bounds else "",
        f"{fmt(step.get('sensitivity'))} {step.get('norm', '')}".strip(),
        str(step.get("mechanism", "")),
        _or_blank(step.get("scale"), fmt),
        _step_cost(cost, zcdp, fmt),
        _error(step, fmt),
        ", ".join(_key_text(k, step) for k in keys),
    ]


def _step_cost(cost: dict[str, Any], zcdp: bool, fmt: Any) -> str:
    """A step's cost as every amount is shown (``render.budget_number``, rounded up)."""
    if zcdp and "rho" in cost:
        return f"ρ={_spent(cost['rho'], fmt)}"
    text = f"ε={_spent(cost.get('epsilon'), fmt)}"
    return text + (f", δ={_spent(cost['delta'], fmt)}" if cost.get("delta") else "")


def _spent(value: Any, fmt: Any) -> str:
    return budget_number(float(value), up=True) if isinstance(value, int | float) else fmt(value)


def _error(step: dict[str, Any], fmt: Any) -> str:
    if step.get("kind") == "quantile" or step.get("mechanism") == "exponential":
        radius = step.get("rank_radius") or rank_radius(step)
        return f"±{math.ceil(radius)} ranks" if radius is not None else "in ranks"
    return _or_blank(step.get("accuracy"), fmt)


def rank_radius(step: dict[str, Any], alpha: float = ALPHA) -> float | None:
    """``scale · ln(candidates / alpha) / d``, d the denominator of the level q
    (docs/accuracy.md, "Accuracy of quantiles"), when the step gives its ``level``
    (a gate that sent no ``rank_radius``); never read from the aggregate's text."""
    level = step.get("level")
    scale, candidates = step.get("scale"), step.get("candidates")
    if level is None or not scale or not candidates:
        return None
    denominator = Fraction(str(level)).limit_denominator(10_000).denominator
    return float(scale) * math.log(float(candidates) / alpha) / denominator


def _key_text(key: dict[str, Any], step: dict[str, Any]) -> str:
    """A public key with how many values it has; a private one with how it is chosen."""
    if key.get("public", True):
        return f"{key['column']} ({key['values']} public)"
    if step.get("kind") == "partition_selection":
        return f"{key['column']} (private: kept if noisy units ≥ {step.get('threshold')})"
    return f"{key['column']} (private: DP partition selection)"


def _or_blank(value: Any, fmt: Any) -> str:
    return "" if value is None else fmt(value)
