"""Noise, from OpenDP's samplers only.

Every released number is an integer on a grid before noise is added: counts
are integers, sums are integers in units of ``2**k`` (the rewrite rounds each
value to that grid before summing). Noise is therefore always integer noise
drawn by OpenDP: discrete Laplace (pure and approximate DP) or discrete
Gaussian (zCDP). For a float aggregate this is the granular mechanism of
OpenDP's float ``make_laplace``/``make_gaussian`` with ``k``: it too rounds to
the ``2**k`` grid and adds integer noise, so the floating-point attacks on
textbook Laplace (Mironov 2012) do not apply.

The exact integer may exceed 64 bits (sums are computed as 128-bit
integers), so a zero-centred sample is drawn and added in Python's exact
integer arithmetic; both distributions are shift-invariant on the integers,
so this is the same distribution as noising the value itself.

Privacy maps and accuracy figures are OpenDP's too: a scale is chosen from a
closed form and then nudged until OpenDP's own (conservatively rounded) map
or accuracy function agrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
from opendp import measurements
from opendp.accuracy import (
    accuracy_to_discrete_gaussian_scale,
    accuracy_to_discrete_laplacian_scale,
    discrete_gaussian_scale_to_accuracy,
    discrete_laplacian_scale_to_accuracy,
)
from opendp.domains import atom_domain, vector_domain
from opendp.metrics import absolute_distance, l1_distance, l2_distance
from opendp.mod import Measurement, enable_features

from dpmagic.gate.dp.fast_noise import discrete_laplace, exact_scale
from dpmagic.gate.failures import Refused

enable_features("contrib")

DISCRETE_LAPLACE = "discrete_laplace"
GRANULAR_LAPLACE = "granular_laplace"
DISCRETE_GAUSSIAN = "discrete_gaussian"
GRANULAR_GAUSSIAN = "granular_gaussian"
_I64_MAX = 2**63 - 1
# OpenDP's integer samples saturate at the i64 limits, and a saturated draw added to
# the exact value would give that value away. Below this scale (in grid units) a
# draw reaches 2**63 with probability under e**-128; above it the query is refused.
MAX_SCALE = 2.0**56
# Above this scale a Gaussian interval is computed in closed form (``_gaussian_half_width``).
GAUSSIAN_EXACT_SCALE = 1e4
# From this many cells on, noise comes from ``fast_noise``: a call of OpenDP's sampler
# costs about 60 µs and 8 µs a cell, of ours 70 µs and 1.5 µs a cell (20 cells: 170
# against 100 µs; an average by 20 keys draws two such vectors).
FAST_NOISE_CELLS = 8


@dataclass(frozen=True)
class LaplaceNoise:
    """Discrete Laplace noise for an integer vector of known L1 sensitivity.

    ``sensitivity`` and ``scale`` are in grid units; ``granularity`` is the
    grid step ``2**k`` that turns units into released values.
    """

    sensitivity: int
    scale: float
    granularity: float = 1.0

    @property
    def mechanism(self) -> str:
        return DISCRETE_LAPLACE if self.granularity == 1.0 else GRANULAR_LAPLACE

    @property
    def epsilon(self) -> float:
        """The ε OpenDP's privacy map proves for this sensitivity and scale."""
        return _laplace_map(self.scale, self.sensitivity)

    @property
    def rho(self) -> float:
        """ε-DP implies (ε²/2)-zCDP (Bun and Steinke 2016, Proposition 1.4)."""
        return self.epsilon * self.epsilon / 2  # inf, not an error, for huge ε

    def sample(self, size: int) -> list[int]:
        """``size`` independent zero-centred integer noise draws; long vectors from the
        vectorised sampler of the same distribution (``fast_noise``)."""
        if size == 0:
            return []
        exact = exact_scale(self.scale) if size >= FAST_NOISE_CELLS else None
        if exact is not None:
            return discrete_laplace(*exact, size).tolist()
        return list(_laplace_vector(self.scale)([0] * size))

    def sample_array(self, size: int) -> np.ndarray:
        """``sample``'s draws as an int64 array: a long vector straight from
        ``fast_noise``, without a Python int per draw (the same sampler ``sample``
        uses; below ``MAX_SCALE`` no draw reaches 2**63)."""
        exact = exact_scale(self.scale) if size >= FAST_NOISE_CELLS else None
        if exact is not None:
            return discrete_laplace(*exact, size)
        return np.asarray(self.sample(size), dtype=np.int64)

    def half_width(self, alpha: float) -> float:
        """Half-width of an interval that holds the noise with probability ≥ 1-alpha, in
        released units."""
        if self.scale == 0:
            return 0.0
        return _laplace_half_width(self.scale, alpha) * self.granularity


@dataclass(frozen=True)
class GaussianNoise:
    """Discrete Gaussian noise for an integer vector of known L2 sensitivity.

    ``sensitivity`` (an upper bound on the L2 norm, so a float) and ``scale``
    (σ) are in grid units, as for :class:`LaplaceNoise`.
    """

    sensitivity: float
    scale: float
    granularity: float = 1.0

    @property
    def mechanism(self) -> str:
        return DISCRETE_GAUSSIAN if self.granularity == 1.0 else GRANULAR_GAUSSIAN

    @property
    def rho(self) -> float:
        """The ρ (zCDP) OpenDP's privacy map proves for this sensitivity and scale."""
        return _gaussian_map(self.scale, self.sensitivity)

    def sample(self, size: int) -> list[int]:
        if size == 0:
            return []
        return list(_gaussian_vector(self.scale)([0] * size))

    def sample_array(self, size: int) -> np.ndarray:
        """``sample``'s draws as an int64 array (OpenDP's, one by one)."""
        return np.asarray(self.sample(size), dtype=np.int64)

    def half_width(self, alpha: float) -> float:
        if self.scale == 0:
            return 0.0
        return _gaussian_half_width(self.scale, alpha) * self.granularity


Noise = LaplaceNoise | GaussianNoise


def calibrate(sensitivity: int, epsilon: float, granularity: float = 1.0) -> LaplaceNoise:
    """The smallest Laplace scale whose OpenDP privacy map stays within ``epsilon``.

    The map is OpenDP's, not ours: we start from Δ/ε and step the scale up
    by ulps until OpenDP's own (conservatively rounded) map agrees.
    """
    _check_l1(sensitivity)
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    if sensitivity == 0:
        # A constant release needs no noise; a zero scale keeps the type uniform.
        return LaplaceNoise(0, 0.0, granularity)
    scale = sensitivity / epsilon
    _check_scale(scale)
    while _laplace_map(scale, sensitivity) > epsilon:
        scale = math.nextafter(scale, math.inf)
    return LaplaceNoise(sensitivity, scale, granularity)


def calibrate_gaussian(sensitivity: float, rho: float, granularity: float = 1.0) -> GaussianNoise:
    """The smallest discrete Gaussian σ whose OpenDP privacy map stays within ``rho``:
    Δ₂/√(2ρ), stepped up until OpenDP's map agrees."""
    _check_l2(sensitivity)
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError("rho must be positive and finite")
    if sensitivity == 0:
        return GaussianNoise(0.0, 0.0, granularity)
    scale = sensitivity / math.sqrt(2 * rho)
    _check_scale(scale)
    while _gaussian_map(scale, sensitivity) > rho:
        scale = math.nextafter(scale, math.inf)
    return GaussianNoise(sensitivity, scale, granularity)


def laplace_for_accuracy(
    sensitivity: int, accuracy: float, alpha: float, granularity: float = 1.0
) -> LaplaceNoise:
    """The largest Laplace scale whose (1-alpha) interval is at most ±``accuracy``
    (in released units), from OpenDP's accuracy-to-scale map."""
    _check_l1(sensitivity)
    scale = _scale_for_accuracy(
        accuracy_to_discrete_laplacian_scale,
        lambda s: LaplaceNoise(sensitivity, s, granularity).half_width(alpha),
        accuracy,
        alpha,
        granularity,
    )
    return LaplaceNoise(sensitivity, scale if sensitivity else 0.0, granularity)


def gaussian_for_accuracy(
    sensitivity: float, accuracy: float, alpha: float, granularity: float = 1.0
) -> GaussianNoise:
    """The largest discrete Gaussian σ whose (1-alpha) interval is at most ±``accuracy``."""
    _check_l2(sensitivity)
    scale = _scale_for_accuracy(
        accuracy_to_discrete_gaussian_scale,
        lambda s: GaussianNoise(sensitivity, s, granularity).half_width(alpha),
        accuracy,
        alpha,
        granularity,
    )
    return GaussianNoise(sensitivity, scale if sensitivity else 0.0, granularity)


def sqrt_up(n: int) -> float:
    """A float at least √n: L2 sensitivities must never be rounded down."""
    root = math.sqrt(n)
    while root * root < n:
        root = math.nextafter(root, math.inf)
    return root


def _scale_for_accuracy(to_scale, half_width, accuracy: float, alpha: float, step: float) -> float:
    """OpenDP's scale for "an error of ``tail`` units or more has probability ≤ alpha",
    where ``tail`` is one grid unit beyond the widest whole number of units within
    ``accuracy``; nudged down until the interval OpenDP reports for it fits."""
    if not (accuracy > 0 and math.isfinite(accuracy)):
        raise ValueError("accuracy must be positive and finite")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be between 0 and 1")
    tail = math.floor(accuracy / step) + 1
    scale = to_scale(float(tail), alpha)
    while scale > 0 and half_width(scale) > accuracy:
        scale = math.nextafter(scale, 0.0)
    _check_scale(scale)
    return scale


# The release pass asks for the same interval once per released cell (1,000 cells, 1,000
# calls of ~0.1 ms into OpenDP); it depends on the scale and alpha only.
@lru_cache(maxsize=1024)
def _laplace_half_width(scale: float, alpha: float) -> int:
    return _integer_half_width(discrete_laplacian_scale_to_accuracy(scale, alpha))


@lru_cache(maxsize=1024)
def _gaussian_half_width(scale: float, alpha: float) -> int:
    if scale > GAUSSIAN_EXACT_SCALE:
        # OpenDP sums the discrete Gaussian's tail term by term, in time linear in the
        # scale (0.24 s at 1e6, minutes at the 2**24 of a fine float grid). Beyond this
        # scale the continuous quantile, two units wider, is never narrower than
        # OpenDP's figure (tests/unit/test_mechanisms.py checks it from 1e4 to 2e6)
        # and wider by at most a few units in millions.
        z = NormalDist().inv_cdf(1 - alpha / 2)
        return _integer_half_width(math.ceil(z * scale * (1 + 1e-9)) + 2)
    return _integer_half_width(discrete_gaussian_scale_to_accuracy(scale, alpha))


def _integer_half_width(tail: float) -> int:
    """OpenDP's accuracy ``a`` means P(|noise| ≥ a) ≤ alpha; integer noise then stays
    within the largest integer below ``a``. OpenDP's formula underflows at scales below
    ~1e-3, where a draw is non-zero with probability about 2e**-1000: the interval is
    then the point."""
    if not math.isfinite(tail):
        return 0
    return max(0, math.ceil(tail) - 1)


def _check_scale(scale: float) -> None:
    if not scale <= MAX_SCALE:
        raise Refused(
            "the budget share is too small for this aggregate's declared bounds: its noise "
            "could not be sampled exactly; ask for a larger ε or declare narrower bounds"
        )


def _check_l1(sensitivity: int) -> None:
    if sensitivity < 0 or sensitivity > _I64_MAX:
        raise ValueError("sensitivity out of the range OpenDP's integer Laplace accepts")


def _check_l2(sensitivity: float) -> None:
    if not (0 <= sensitivity < 2.0**63):
        raise ValueError("sensitivity out of the range OpenDP's integer Gaussian accepts")


# A plan asks OpenDP's map for each measurement's ε or ρ several times (calibrating,
# pricing, the reply's figures), ~0.1 ms a call across the FFI; the map is a pure
# function of two public numbers, so its answers are kept (``typed``: an int
# sensitivity is not answered for a float one, which the i64 map would refuse). Like
# the measurements below, the memo is the process's: whether anyone asked for a scale
# before moves a dry run's time by a fraction of a millisecond, as the cached
# measurement of that scale already did; it says nothing of the data.
@lru_cache(maxsize=4096, typed=True)
def _laplace_map(scale: float, sensitivity: int) -> float:
    if sensitivity == 0:
        return 0.0
    return _laplace_scalar(scale).map(sensitivity)


@lru_cache(maxsize=4096, typed=True)
def _gaussian_map(scale: float, sensitivity: float) -> float:
    if sensitivity == 0:
        return 0.0
    return _gaussian_l2(scale).map(float(sensitivity))


@lru_cache(maxsize=256)
def _laplace_vector(scale: float) -> Measurement:
    return measurements.make_laplace(
        vector_domain(atom_domain(T="i64")), l1_distance(T="i64"), scale=scale
    )


@lru_cache(maxsize=256)
def _laplace_scalar(scale: float) -> Measurement:
    return measurements.make_laplace(atom_domain(T="i64"), absolute_distance(T="i64"), scale=scale)


@lru_cache(maxsize=256)
def _gaussian_vector(scale: float) -> Measurement:
    return measurements.make_gaussian(
        vector_domain(atom_domain(T="i64")), l2_distance(T="i64"), scale=scale
    )


@lru_cache(maxsize=256)
def _gaussian_l2(scale: float) -> Measurement:
    """The same discrete Gaussian, with its map taken over a real-valued L2 distance."""
    return measurements.make_gaussian(
        vector_domain(atom_domain(T="i64")), l2_distance(T="f64"), scale=scale
    )
