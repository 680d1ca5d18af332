"""The 95% error of an average or a variance at the least favourable values its bounds
allow, as ``n`` times its half-width in a group of ``n`` rows: the dry run states it per
group size before anything is spent (``summary``), and the release pass judges noise
dominance by it at the smallest size a group's noisy count allows (``dominance``), so a
lucky draw whose own interval came out narrow is still judged by what its noise can
do. Public: a function of the plan alone. The linearised error is also the calibrated
interval of a variance's cell (``variance_half_width``, ``intervals``).

Imports no pass at run time: the aggregate kinds name these errors (``Aggregate
.expected``), and the check pass imports the kinds."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

from dpmagic.gate.sql.aggregates.parts import Avg, Variance

if TYPE_CHECKING:
    from dpmagic.gate.sql.plan_types import Measurement, Plan

# Bisection steps: each end is the outer end of a final bracket 2**-14 of the first
# (ten standard deviations wide for an average): wider than exact by at most
# a thousandth of a standard deviation, never narrower, in 14 steps a cell.
BISECTION_STEPS = 14


def average_error(plan: Plan, parts: Avg, alpha: float) -> float:
    """``n`` times an average's linearised error ``(e_S − m·e_N)/n`` at its quantile,
    with the mean ``m`` at the bound farthest from the sum's centre."""
    total, count = plan.measurement(parts.total), plan.measurement(parts.count)
    c = total.centre_value
    far = max(abs(total.bounds.lo - c), abs(total.bounds.hi - c))
    return mix_quantile([total.scale, far * count.scale], gaussian(count), alpha)


def variance_error(plan: Plan, parts: Variance, alpha: float) -> float:
    """``n`` times a variance's linearised error (``variance_half_width``), at
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


def laplace_mix_tail(z: float, scales: list[float]) -> float:
    """``P(|Σ X_i| ≥ z)`` for independent Laplace ``X_i`` of distinct positive scales
    ``b_i``: ``Σ_i c_i·e^(−z/b_i)``, ``c_i = Π_(j≠i) b_i²/(b_i² − b_j²)`` (the partial
    fractions of the characteristic function ``Π 1/(1 + b_i²t²)``)."""
    total = 0.0
    for i, b in enumerate(scales):
        # b²/(b² − o²) as 1/(1 − (o/b)²): the squares of tiny scales underflow to 0.
        c = math.prod(1 / (1 - (o / b) ** 2) for j, o in enumerate(scales) if j != i)
        total += c * math.exp(-z / b)
    return min(max(total, 0.0), 1.0)


def mix_quantile(scales: list[float], gaussian: bool, alpha: float) -> float:
    """The least ``h`` with ``P(|Σ X_i| > h) ≤ alpha`` for independent Laplace (scales)
    or normal (standard deviations) ``X_i``. Laplace scales closer than 0.1% are
    moved apart upward first: a sum of symmetric unimodal variables only spreads
    when one of them is scaled up (Anderson 1955), so this errs wide."""
    scales = sorted(b for b in scales if b > 0)
    if not scales:
        return 0.0
    if gaussian:
        return NormalDist().inv_cdf(1 - alpha / 2) * math.sqrt(math.fsum(b * b for b in scales))
    apart = [scales[0]]
    for b in scales[1:]:
        apart.append(max(b, apart[-1] * 1.001))
    # A union bound gives an end that is certainly wide enough.
    low, high = 0.0, math.log(len(apart) / alpha) * math.fsum(apart)
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if laplace_mix_tail(mid, apart) > alpha else (low, mid)
    return high


def variance_half_width(
    n: float,
    m: float,
    q: float,
    centres: tuple[float, float],
    scales: tuple[float, float, float],
    gaussian: bool,
    alpha: float,
) -> float:
    """The half-width of a (1 − alpha) interval around a variance estimated as ``q − m²``,
    with ``m = c₁ + S₁/N`` and ``q = c₂ + S₂/N`` from a noisy count ``N`` and noisy
    sums ``S₁``, ``S₂`` centred on ``centres`` (``c₁``, ``c₂``) whose noises have
    ``scales`` (count, sum, sum of squares; Laplace scales or normal σ).

    To first order the estimate errs by ``(e₂ − 2m·e₁ + (2m(m − c₁) − (q −
    c₂))·e_N)/N``, a weighted sum of the three independent noises, whose
    quantile is computed exactly for Laplace (or normal) terms: an interval at
    its level, where interval arithmetic over the three measurements' own
    intervals holds the variance far more often than asked. The weights use
    the estimates themselves; their error is second order when ``N`` is well
    above its noise, which the caller checks.
    """
    c1, c2 = centres
    b_n, b_1, b_2 = scales
    weights = [b_2 / n, abs(2 * m) * b_1 / n, abs(2 * m * (m - c1) - (q - c2)) * b_n / n]
    return mix_quantile(weights, gaussian, alpha)
