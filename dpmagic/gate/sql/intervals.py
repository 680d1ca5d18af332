"""Calibrated confidence intervals for averages and variances, from noisy values only.

Averages: Fieller's method, below. Variances: :func:`variance_half_width`.

An average is released as ``centre + S/N``.

``S`` is a noisy centred sum and ``N`` a noisy count of the same rows: ``S = σ +
e_S`` and ``N = ν + e_N`` for the exact ``σ = Σ(v − centre)``, ``ν`` and
independent noises ``e_S``, ``e_N`` whose distributions the plan fixes. For the
exact average ``a = centre + σ/ν``, with ``u = a − centre``,

    ``S − u·N = e_S − u·e_N``

exactly, since ``σ − u·ν = 0``. So for every candidate ``u`` the left side is
computable from the released values and, *if ``u`` is the true one*, has a
known distribution: that of ``e_S − u·e_N``. The set of ``u`` whose value is
not in that distribution's outer ``alpha`` (``P(|e_S − u·e_N| ≥ |S − u·N|) >
alpha``) therefore holds the true ``u`` with probability at least ``1 −
alpha``, at every data set: no approximation of the ratio is made. This is
Fieller's (1954) construction, here with Laplace or Gaussian noise instead of
normal sampling error; it is derived from the plan and the noisy values only,
so it is post-processing.

The box the sum's and the count's own intervals span (each at ``alpha/2``)
holds the answer with probability at least ``1 − alpha`` too, but by a union
bound over two events that are rarely both near their edge: measured at 98.7%
for a 95% level. Fieller's set is the tightest of this kind, at its level.

Two approximations remain, both shown by ``tests/unit/test_intervals.py`` to keep the
coverage within [93%, 97.5%] at a 95% level: the noises are the discrete
Laplace or Gaussian on a fine grid, whose tails are taken to be the
continuous distributions' of the same scale (they differ by about one grid
unit over the scale); and the set is taken to be the interval it is when
``N`` is well above its noise (it is found by bisection outward from the
point estimate). Where ``N`` is not (below twice its own interval's
half-width), or where the two noises are of different kinds, the box is
used instead: wider, never narrower than its level needs.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

# Bisection steps: each end is the outer end of a final bracket 2**-14 of the first
# (ten standard deviations wide for an average): wider than exact by at most
# a thousandth of a standard deviation, never narrower, in 14 steps a cell.
_STEPS = 14


def laplace_sum_tail(z: np.ndarray, b1: float, b2: np.ndarray) -> np.ndarray:
    """``P(|X + Y| ≥ z)`` for independent Laplace ``X`` of scale ``b1`` and ``Y`` of
    scales ``b2`` (elementwise; ``z`` and ``b2`` of one shape), ``z ≥ 0``: ``(b1²e^(−z/b1)
    − b2²e^(−z/b2)) / (b1² − b2²)``, whose limit ``e^(−z/b)(1 + z/(2b))`` serves where
    the scales (nearly) coincide."""
    b2 = np.maximum(b2, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e1 = np.exp(-z / b1)
        positive = b2 > 0
        e2 = (
            np.exp(-z / b2)
            if positive.all()
            else np.where(positive, np.exp(-z / np.where(positive, b2, 1.0)), 0.0)
        )
        out = (b1 * b1 * e1 - b2 * b2 * e2) / (b1 * b1 - b2 * b2)
        near = np.abs(b1 - b2) < 1e-6 * b1
        if near.any():  # computed only where it is used: the same values, fewer steps
            mid = (b1 + b2[near]) / 2
            out[near] = np.exp(-z[near] / mid) * (1 + z[near] / (2 * mid))
    return np.clip(out, 0.0, 1.0)


def gaussian_sum_tail(z: np.ndarray, s1: float, s2: np.ndarray) -> np.ndarray:
    """``P(|X + Y| ≥ z)`` for independent centred normals of standard deviations ``s1``
    and ``s2``."""
    sd = np.sqrt(s1 * s1 + s2 * s2)
    return np.vectorize(math.erfc, otypes=[float])(z / (sd * math.sqrt(2)))


def fieller(
    sums: np.ndarray,
    counts: np.ndarray,
    low: float,
    high: float,
    sum_scale: float,
    count_scale: float,
    gaussian: bool,
    alpha: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The ends of the (1 − alpha) Fieller interval for ``u = σ/ν`` in ``[low, high]``,
    one per cell, from noisy centred sums and counts and the noises' scales (Laplace
    scale, or Gaussian σ, in released units). A cell whose set within the bounds is
    empty (the estimate far outside them) gets the bound nearest its estimate."""
    tail = gaussian_sum_tail if gaussian else laplace_sum_tail
    size = len(sums)
    # Both ends at once: the lower end's search in the first half, the upper's in the second.
    s2, n2 = np.concatenate([sums, sums]), np.concatenate([counts, counts])

    def inside(u: np.ndarray) -> np.ndarray:
        return tail(np.abs(s2 - u * n2), sum_scale, np.abs(u) * count_scale) > alpha

    point = np.clip(sums / counts, low, high)
    # Bracket each end: the bound, or nearer, ten standard deviations of the estimate
    # out (never inside the set but at its own bound, which is then the end).
    sd = np.sqrt(2 * (sum_scale**2 + (point * count_scale) ** 2)) / counts
    reach = 10 * sd
    near = np.concatenate([point, point])
    far = np.concatenate([np.maximum(point - reach, low), np.minimum(point + reach, high)])
    far = np.where(inside(far), np.concatenate([np.full(size, low), np.full(size, high)]), far)
    done = inside(far)
    member = inside(near)
    out = far.copy()
    for _ in range(_STEPS):
        mid = (near + out) / 2
        ok = inside(mid)
        near = np.where(ok, mid, near)
        out = np.where(ok, out, mid)
    ends = np.where(done, far, out)
    ends = np.where(member, ends, np.concatenate([point, point]))
    return ends[:size], ends[size:]


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
    for _ in range(_STEPS):
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
