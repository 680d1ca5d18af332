"""The privacy maps' memo (``mechanisms._laplace_map``, ``_gaussian_map``): a plan asks
OpenDP's map for the same (scale, sensitivity) several times, so the answers are kept.
Kept answers must be OpenDP's answers for exactly those two numbers: checked against
the uncached map over a grid where each scale meets several sensitivities (a memo keyed
on the scale alone, shown below, fails it)."""

from __future__ import annotations

import math
from functools import lru_cache

import pytest

from dpmagic.gate.dp import mechanisms
from dpmagic.gate.dp.mechanisms import calibrate, calibrate_gaussian

SCALES = [0.5, 1.0, 2.0, 3.3, 10.0, 123.456, 1e4]
L1 = [0, 1, 2, 3, 9, 1000]
L2 = [0.0, 1.0, 1.5, math.sqrt(3), 30.0]


def test_the_laplace_memo_answers_as_opendps_map():
    for _ in range(2):  # the second round from the memo
        for scale in SCALES:
            for d in L1:
                assert mechanisms._laplace_map(scale, d) == mechanisms._laplace_map.__wrapped__(
                    scale, d
                ), (scale, d)


def test_the_gaussian_memo_answers_as_opendps_map():
    for _ in range(2):
        for scale in SCALES:
            for d in L2:
                assert mechanisms._gaussian_map(scale, d) == mechanisms._gaussian_map.__wrapped__(
                    scale, d
                ), (scale, d)


def test_calibrations_through_the_memo_are_the_uncached_ones():
    """``calibrate`` steps the scale up until the map agrees: the memo changes nothing
    of the scale it settles on, nor of the ε or ρ the noise reports."""
    for d, eps in [(1, 0.1), (3, 0.5), (8, 1.0), (1, 1e-3), (9, 2.5)]:
        noise = calibrate(d, eps)
        assert noise.epsilon == mechanisms._laplace_map.__wrapped__(noise.scale, d) <= eps
        below = math.nextafter(noise.scale, 0.0)
        assert mechanisms._laplace_map.__wrapped__(below, d) > eps or below < d / eps
    for d2, rho in [(1.0, 0.05), (math.sqrt(3), 0.5), (30.0, 0.01)]:
        noise = calibrate_gaussian(d2, rho)
        assert noise.rho == mechanisms._gaussian_map.__wrapped__(noise.scale, d2) <= rho


def test_an_int_sensitivity_is_not_answered_for_a_float_one():
    """``typed``: OpenDP's integer Laplace map refuses a float distance, and still does
    after the int's answer is kept."""
    mechanisms._laplace_map(2.0, 3)
    with pytest.raises(Exception):  # noqa: B017 (OpenDP's own error type)
        mechanisms._laplace_map(2.0, 3.0)


def test_a_memo_keyed_on_the_scale_alone_is_caught():
    """The comparison above has teeth: a memo that forgot the sensitivity answers the
    first sensitivity's ε for the others."""

    @lru_cache
    def by_scale(scale: float) -> float:
        return mechanisms._laplace_map.__wrapped__(scale, 1)

    wrong = [
        (scale, d)
        for scale in SCALES
        for d in L1[1:]
        if by_scale(scale) != mechanisms._laplace_map.__wrapped__(scale, d)
    ]
    assert wrong
