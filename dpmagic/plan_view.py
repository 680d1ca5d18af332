"""The dry run's plan as a table a newcomer can read.

Each noisy aggregate's row says what it costs in the unit the footer uses
(ε; ρ only under zCDP, where ρ is what adds up), and its expected error:
a count's or sum's 95% half-width, a quantile's rank radius, and for an
average (a sum over a count of the same argument) the error it will have
for a group of n rows, since that depends on n, which is not known before
the query runs. The headers explain the jargon on hover.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

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
                    "radius; for an average, its error for a group of n rows"),
    ("keys", "the groups: public values come from the policy, never from the data"),
)  # fmt: skip
LEVELS = {"MEDIAN": 0.5, "MIN": 0.0, "MAX": 1.0}
QUANTILE_ARGUMENT = re.compile(r"(?:quantile\w*\(.*,\s*|percentile\w*\()\s*([0-9.]+)", re.I)
AVERAGE_EXAMPLES = (100, 1000)


def plan_rows(plan: list[dict[str, Any]], zcdp: bool, fmt: Any) -> list[list[str]]:
    """One row per step of the plan, then one per average made of two of its steps."""
    rows = [_step_row(step, zcdp, fmt) for step in plan]
    return rows + _average_rows(plan, fmt)


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
    if zcdp and "rho" in cost:
        return f"ρ={fmt(cost['rho'])}"
    text = f"ε={fmt(cost.get('epsilon'))}"
    return text + (f", δ={fmt(cost['delta'])}" if cost.get("delta") else "")


def _error(step: dict[str, Any], fmt: Any) -> str:
    if step.get("kind") == "quantile" or step.get("mechanism") == "exponential":
        radius = step.get("rank_radius") or rank_radius(step)
        return f"±{math.ceil(radius)} ranks" if radius is not None else "in ranks"
    return _or_blank(step.get("accuracy"), fmt)


def rank_radius(step: dict[str, Any], alpha: float = 0.05) -> float | None:
    """``scale · ln(candidates / alpha) / d``, d the denominator of the level q
    (docs/accuracy.md, "Accuracy of quantiles"), when the step names its level."""
    level = step.get("level")
    if level is None:
        level = _level(str(step.get("aggregate", "")))
    scale, candidates = step.get("scale"), step.get("candidates")
    if level is None or not scale or not candidates:
        return None
    denominator = Fraction(str(level)).limit_denominator(10_000).denominator
    return float(scale) * math.log(float(candidates) / alpha) / denominator


def _level(aggregate: str) -> float | None:
    name = aggregate.split("(", 1)[0].strip().upper()
    if name in LEVELS:
        return LEVELS[name]
    match = QUANTILE_ARGUMENT.search(aggregate)
    return float(match.group(1)) if match else None


def _average_rows(plan: list[dict[str, Any]], fmt: Any) -> list[list[str]]:
    """``AVG(x)`` from ``SUM(x)`` and ``COUNT(x)``: its error for a group of n rows.

    The noisy mean is (S + e_s)/(n + e_c); for n large next to e_c its error is
    about (e_s − mean·e_c)/n, at most (A_s + max|bound|·A_c)/n at 95% each.
    """
    sums = {s["aggregate"][4:]: s for s in plan if str(s.get("aggregate", "")).startswith("SUM(")}
    rows = []
    for step in plan:
        aggregate = str(step.get("aggregate", ""))
        argument = aggregate[6:] if aggregate.startswith("COUNT(") else None
        total = sums.get(argument) if argument else None
        if total is None or total.get("accuracy") is None or step.get("accuracy") is None:
            continue
        bounds = total.get("bounds") or [0, 0]
        numerator = float(total["accuracy"]) + max(abs(float(b)) for b in bounds) * float(
            step["accuracy"]
        )
        examples = ", ".join(f"±{fmt(numerator / n)} at n = {n:,}" for n in AVERAGE_EXAMPLES)
        rows.append(
            [f"AVG({argument}", "", "", "SUM / COUNT", "", "(the two above)",
             f"≈ ±{fmt(numerator)} / n ({examples})", ""]
        )  # fmt: skip
    return rows


def _key_text(key: dict[str, Any], step: dict[str, Any]) -> str:
    """A public key with how many values it has; a private one with how it is chosen."""
    if key.get("public", True):
        return f"{key['column']} ({key['values']} public)"
    if step.get("kind") == "partition_selection":
        return f"{key['column']} (private: kept if noisy units ≥ {step.get('threshold')})"
    return f"{key['column']} (private: DP partition selection)"


def _or_blank(value: Any, fmt: Any) -> str:
    return "" if value is None else fmt(value)
