"""``dp/group_privacy``: the cost at distance ``k``, against the mechanisms' own
privacy loss at that distance; a rule that scales by √k is caught."""

from __future__ import annotations

import math

import pytest

from dpmagic.gate.dp.group_privacy import approx_group, pure_group, zcdp_group


def _laplace_loss(scale: float, shift: float) -> float:
    """The largest log-ratio of two Laplace densities ``shift`` apart, over a grid."""
    xs = [i / 10 for i in range(-400, 401)]
    return max(abs((abs(x - shift) - abs(x)) / scale) for x in xs)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_pure_is_the_laplace_loss_at_distance_k(k):
    scale = 2.0
    epsilon = _laplace_loss(scale, 1.0)  # distance 1
    assert pure_group(epsilon, k) == pytest.approx(_laplace_loss(scale, float(k)))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_zcdp_is_the_gaussian_rho_at_distance_k(k):
    sigma = 3.0
    rho = 1.0 / (2 * sigma**2)  # sensitivity 1: Bun and Steinke's ρ of the Gaussian
    assert zcdp_group(rho, k) == pytest.approx((k * 1.0) ** 2 / (2 * sigma**2))


def test_approx_is_pure_at_delta_zero_and_grows_with_k():
    assert approx_group(0.5, 0.0, 3) == (1.5, 0.0)
    deltas = [approx_group(0.5, 1e-6, k)[1] for k in (1, 2, 3)]
    assert deltas[0] == pytest.approx(1e-6) and deltas[0] < deltas[1] < deltas[2]
    assert deltas[2] == pytest.approx(3 * math.exp(1.0) * 1e-6)


def test_a_rule_scaling_by_the_square_root_is_caught():
    scale = 2.0
    epsilon = _laplace_loss(scale, 1.0)
    assert math.sqrt(4) * epsilon < _laplace_loss(scale, 4.0)  # √k·ε under-states it
