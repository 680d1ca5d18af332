"""A plan as the dry run and every reply show it: per noisy aggregate its bounds,
sensitivity, mechanism, scale, cost and expected error, and where the group keys
come from. All of it is public: a function of the query and the policy alone."""

from __future__ import annotations

import math

from dpmagic.gate.accounting import Cost
from dpmagic.gate.calibration import REPORT_ALPHA
from dpmagic.gate.sql.keys import KeyDomain
from dpmagic.gate.sql.plan import Plan


def summary(the_plan: Plan) -> list[dict[str, object]]:
    """The plan per measurement, all of it public: bounds, sensitivity, mechanism,
    scale, cost, the expected 95% error, and where the group keys come from."""
    keys = [
        {
            "column": k.label,
            "public": d.private is None,
            "values": None if d.private else len(d.values),
            "source": _key_source(d),
        }
        for k, d in zip(the_plan.keys, the_plan.domains, strict=True)
    ]
    partitions = None if the_plan.key_selection else len(the_plan.partitions)
    steps = []
    for m in the_plan.measurements:
        step: dict[str, object] = {
            "aggregate": m.label,
            "kind": m.kind,
            "bounds": None if m.clamp is None else [m.clamp.lo, m.clamp.hi],
            "sensitivity": m.sensitivity,
            "norm": "L2" if m.noise.mechanism.endswith("gaussian") else "L1",
            "mechanism": m.noise.mechanism,
            "scale": m.scale,
            "epsilon": m.cost.epsilon,
            "cost": cost_dict(m.cost),
            "accuracy": m.noise.half_width(REPORT_ALPHA),
            "partitions": partitions,
            "keys": keys,
            "contribution": {
                "groups": the_plan.contribution.groups,
                "rows": the_plan.contribution.rows,
            },
        }
        if the_plan.accuracy is not None:
            step["requested"] = {
                "accuracy": the_plan.accuracy.half_width,
                "alpha": the_plan.accuracy.alpha,
                "half_width": m.noise.half_width(the_plan.accuracy.alpha),
            }
        steps.append(step)
    return (
        steps
        + [
            {
                "aggregate": s.label,
                "kind": "quantile",
                "bounds": [s.grid.lo, s.grid.hi],
                "sensitivity": s.sensitivity,
                "norm": "symmetric",
                "mechanism": s.noise.mechanism,
                "scale": s.scale,
                "epsilon": s.epsilon,
                "cost": {"epsilon": s.epsilon, "delta": 0.0},
                "candidates": s.grid.size,
                # A quantile's accuracy is in ranks: how far, at 95%, the released
                # value's rank may lie from the level's, whatever the data.
                "level": s.noise.level,
                "rank_radius": s.noise.rank_radius(REPORT_ALPHA),
                "partitions": partitions,
                "keys": keys,
                "contribution": {
                    "groups": the_plan.contribution.groups,
                    "rows": the_plan.contribution.rows,
                },
            }
            for s in the_plan.selections
        ]
        + _key_selection_step(the_plan, keys)
    )


def _key_source(domain: KeyDomain) -> str:
    if domain.private:
        return "DP partition selection"
    return "integer range" if domain.span else "declared values"


def _key_selection_step(the_plan: Plan, keys: list[dict[str, object]]) -> list[dict[str, object]]:
    """The noisy threshold that chooses private keys: its scale, threshold and (ε, δ)."""
    ks = the_plan.key_selection
    if ks is None:
        return []
    return [
        {
            "aggregate": "GROUP BY " + ", ".join(k.label for k in the_plan.keys),
            "kind": "partition_selection",
            "bounds": None,
            "sensitivity": ks.l0 * ks.linf,
            "norm": f"L0 ≤ {ks.l0}, L∞ ≤ {ks.linf}",
            "mechanism": ks.mechanism,
            "scale": ks.scale,
            "threshold": ks.threshold,
            "epsilon": ks.epsilon,
            "cost": {"epsilon": ks.epsilon, "delta": ks.delta},
            "partitions": None,
            "keys": keys,
            "contribution": {
                "groups": the_plan.contribution.groups,
                "rows": the_plan.contribution.rows,
            },
        }
    ]


def cost_dict(cost: Cost) -> dict[str, float]:
    out = {"epsilon": cost.epsilon, "delta": cost.delta}
    if cost.rho and math.isfinite(cost.rho):
        out["rho"] = cost.rho
    return out
