"""The 95% error of an average or a variance at the least favourable values its bounds
allow, as ``n`` times its half-width in a group of ``n`` rows: the dry run states it per
group size before anything is spent (``summary``), and the release pass judges noise
dominance by it at the smallest size a group's noisy count allows (``dominance``), so a
lucky draw whose own interval came out narrow is still judged by what its noise can
do. Public: a function of the plan alone."""

from __future__ import annotations

from dpmagic.gate.sql.aggregates.parts import Avg, Variance
from dpmagic.gate.sql.intervals import mix_quantile, variance_half_width
from dpmagic.gate.sql.plan_types import Measurement, Plan


def average_error(plan: Plan, parts: Avg, alpha: float) -> float:
    """``n`` times an average's linearised error ``(e_S − m·e_N)/n`` at its quantile,
    with the mean ``m`` at the bound farthest from the sum's centre."""
    total, count = plan.measurement(parts.total), plan.measurement(parts.count)
    c = total.centre_value
    far = max(abs(total.bounds.lo - c), abs(total.bounds.hi - c))
    return mix_quantile([total.scale, far * count.scale], gaussian(count), alpha)


def variance_error(plan: Plan, parts: Variance, alpha: float) -> float:
    """``n`` times a variance's linearised error (``intervals.variance_half_width``), at
    the worst mean and mean square the bounds allow."""
    count, total, squares = (plan.measurement(n) for n in parts.names)
    lo, hi = total.bounds.lo, total.bounds.hi
    reach = max(abs(lo), abs(hi))
    centres = (total.centre_value, squares.centre_value)
    scales = (count.scale, total.scale, squares.scale)
    worst = 0.0
    for m in (lo, 0.0 if lo <= 0 <= hi else lo, hi):
        for q in (m * m, reach * reach):
            half = variance_half_width(1.0, m, q, centres, scales, gaussian(count), alpha)
            worst = max(worst, half)
    return worst


def gaussian(m: Measurement) -> bool:
    return m.noise.mechanism.endswith("gaussian")
