"""Rule: how a query's budget is split over its parts (shares of ε, or of ρ).

Every noisy part of a plan (a measurement, a quantile, an end of a quantile's
interval, a partition selection, the bounding report) gets a *weight*, a function
of the query and the policy only; its share of the query's cost is the cost times
its weight over the total weight (``part_share``, rounded down by one part in
10^12; ``total_weight`` adds them up). The shares add up to the cost whatever the
weights, so no choice of weights can spend more than is charged
(``composition.composes`` checks it for every plan), and since the weights read
no data they leak nothing. What the weights decide is accuracy:

- 1 for a count, a sum, a quantile (an even share, the peers' choice);
- an AVG's centred sum and count, and a variance's count, sum and sum of squares,
  by their part in its error (``avg_weights``, ``variance_weights``, which the
  catalogue's average and variance kinds give their parts, ``sql/aggregates/``): the
  split that minimises the linearised error's variance at the mean the plan expects;
- ``EDGE_WEIGHT`` for each end of a quantile's interval in units and
  ``QUANTILE_COUNT_WEIGHT`` for the count of its argument the plan adds;
- a measurement several aggregates read takes the largest weight any of them
  gives it (``measurement_weight``);
- the bounding report, ``left_out.report_weight``.

**The split** (``split``): for noise standard deviations ``Δ_i/ε_i`` (Laplace) the
error ``Σ (a_i·noise_i)²`` is ``Σ c_i/ε_i²`` with ``c_i = a_i²Δ_i²``; at a fixed
``Σ ε_i`` its minimum, by Lagrange (``−2c_i/ε_i³ = λ``), is at
``ε_i ∝ c_i^(1/3) = (a_iΔ_i)^(2/3)``. Gaussian noise of variance ``Δ_i²/(2ρ_i)``
gives ``Σ c_i/ρ_i``, least at ``ρ_i ∝ √c_i = a_iΔ_i``. The weights are scaled to
add up to the number of parts, so an aggregate of ``k`` parts takes ``k`` even
shares in all, as before it was weighted. ``tests/unit/dp/test_shares.py``
checks both optima against every split on a grid, and that an even split loses;
``tests/unit/dp/test_composition.py`` that the shares compose to the charge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from dpmagic.gate.dp.accounting import Accountant, Cost
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.sums import sum_l2_squared, sum_sensitivity
from dpmagic.gate.policy import Neighbouring

EDGE_WEIGHT = 0.5
"""Each end of a quantile's interval in units (``edges``) takes half the share its
quantile takes. The interval spans about twice an end's radius in ranks, the value's
error one radius: at half, the interval spans about ±10 of the value's radius alone
(in ranks over the group's size) and the value's radius grows 2.25 times; at a quarter
±16 and 1.75 times; at an equal share ±7.5 and 3.25 times."""
QUANTILE_COUNT_WEIGHT = 0.25
"""The share of a ``COUNT`` of a quantile's argument the plan adds when the query has
none, beside its quantile's 1: the verdict and the edges need only its lower end."""


def unit_sensitivities(
    c: Contribution, neighbouring: Neighbouring, gaussian: bool
) -> tuple[float, float]:
    """The sensitivities of a sum of values in ``[−1, 1]`` and of a count, in the norm
    the noise is calibrated to: every centred sum's is this times its range's half-width."""
    if gaussian:
        norm = (sum_l2_squared(-1, 1, c, neighbouring), sum_l2_squared(1, 1, c, neighbouring))
        return math.sqrt(norm[0]), math.sqrt(norm[1])
    return float(sum_sensitivity(-1, 1, c, neighbouring)), float(
        sum_sensitivity(1, 1, c, neighbouring)
    )


def split(coefficients: tuple[float, ...], gaussian: bool) -> tuple[float, ...]:
    """Weights, adding up to the number of parts, that minimise ``Σ (a_i·noise_i)²``
    for noise standard deviations ``Δ_i/ε_i`` (Laplace: the least ``Σ a_i²/ε_i²``
    for a fixed ``Σ ε_i`` is at ``ε_i ∝ a_i^(2/3)``) or ``Δ_i/√(2ρ_i)`` (Gaussian:
    at ``ρ_i ∝ a_i``), where ``a_i`` is the part's coefficient in the linearised
    error times its sensitivity."""
    powered = [a if gaussian else a ** (2 / 3) for a in coefficients]
    total = math.fsum(powered)
    return tuple(len(powered) * p / total for p in powered)


def avg_weights(c: Contribution, neighbouring: Neighbouring, gaussian: bool) -> tuple[float, float]:
    """The weights of an AVG's centred sum and count.

    With ``m`` the true mean's distance from the centre, the noisy average
    ``centre + S/N`` errs by about ``(e_S − m·e_N)/N`` for noises ``e_S`` and
    ``e_N``: the count's noise matters in proportion to ``|m|``, which the plan
    cannot know. It takes the mean anywhere in the bounds with equal chance
    (``E m² = R²/3`` for the half-range ``R``): the coefficients are ``Δ_S = R·s``
    and ``R/√3·Δ_N``. An even split, the peers' choice, is best only when
    the mean sits at a bound; at the centre this split's error is 15% smaller,
    at a bound 3% larger.
    """
    s, n = unit_sensitivities(c, neighbouring, gaussian)
    total, count = split((s, n / math.sqrt(3)), gaussian)
    return total, count


def variance_weights(
    c: Contribution, neighbouring: Neighbouring, gaussian: bool
) -> tuple[float, float, float]:
    """The weights of a variance's count, centred sum and centred sum of squares.

    For values ``y`` (the distance to the middle of the bounds, within ``[−R, R]``)
    with mean ``m`` and mean square ``q``, the variance ``q − m²`` estimated as
    ``(c₂ + S₂/N) − (c₁ + S₁/N)²`` (``c₁``, ``c₂`` the sums' centres, ``c₂ ≈ R²/2``)
    errs by about ``(e₂ − 2m·e₁ + (2m² − q + c₂)·e_N)/N``. Taking ``m`` anywhere in
    ``[−R, R]`` with equal chance and ``q`` halfway between its least (``m²``) and
    largest (``R²``) values, the coefficients are, in units of ``R²``: ``Δ₂ =
    s/2`` for the sum of squares (its range is ``[−R²/2, R²/2]`` once centred),
    ``2/√3·s`` for the sum (``E (2m)² = 4R²/3``) and ``1.5/√5·Δ_N`` for the
    count (``2m² − q + c₂ = 1.5m²``, ``E m⁴ = R⁴/5``).
    """
    s, n = unit_sensitivities(c, neighbouring, gaussian)
    count, total, squares = split((1.5 / math.sqrt(5) * n, 2 / math.sqrt(3) * s, s / 2), gaussian)
    return count, total, squares


def measurement_weight(demands: Sequence[float]) -> float:
    """A measurement's weight: the largest any aggregate reading it gives it; one no
    aggregate reads is the count the plan adds for a quantile."""
    return max(demands) if demands else QUANTILE_COUNT_WEIGHT


def total_weight(
    measurements: Iterable[float], quantiles: int, edges: bool, private: bool
) -> float:
    """The weights of a plan's parts added up: its measurements', 1 per quantile and
    ``EDGE_WEIGHT`` for each end of its interval (with ``edges``), and 1 for the
    partition selection of keys chosen from the data (``private``). The bounding
    report's weight comes on top (``left_out.report_weight``)."""
    total = math.fsum(measurements) + (1 if private else 0)
    return total + quantiles * (1 + (2 * EDGE_WEIGHT if edges else 0))


def part_share(accountant: Accountant, asked: Cost, total: float, weight: float) -> Cost:
    """The share of the query's cost ``asked`` a part of this ``weight`` gets, of the
    ``total`` weight. A weighted share is rounded down by one part in 10^12, so that
    rounding cannot make the shares add up to more than the query is charged."""
    if weight == 1.0:
        return accountant.share(asked, total)
    return accountant.share(asked, total / weight * (1 + 1e-12))
