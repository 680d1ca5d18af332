"""Noise, from OpenDP's samplers only.

Every released number is an integer on a grid before noise is added: counts
are integers, sums are integers in units of ``2**k`` (the rewrite rounds each
value to that grid before summing). Noise is therefore always discrete
Laplace on the integers, drawn by OpenDP. For a float aggregate this is the
granular Laplace mechanism of OpenDP's float ``make_laplace`` with ``k``: it
too rounds to the ``2**k`` grid and adds integer discrete Laplace noise, so
the floating-point attacks on textbook Laplace (Mironov 2012) do not apply.

The exact integer may exceed 64 bits (sums are computed as 128-bit
integers), so a zero-centred sample is drawn and added in Python's exact
integer arithmetic; discrete Laplace is shift-invariant on the integers, so
this is the same distribution as noising the value itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import opendp.prelude as dp
from opendp.accuracy import discrete_laplacian_scale_to_accuracy

from dpmagic.gate.errors import Refused
from dpmagic.gate.fast_noise import discrete_laplace, exact_scale

dp.enable_features("contrib")

DISCRETE_LAPLACE = "discrete_laplace"
GRANULAR_LAPLACE = "granular_laplace"
_I64_MAX = 2**63 - 1
# OpenDP's integer samples saturate at the i64 limits, and a saturated draw added to
# the exact value would give that value away. Below this scale (in grid units) a
# draw reaches 2**63 with probability under e**-128; above it the query is refused.
MAX_SCALE = 2.0**56
# From this many cells on, noise comes from ``fast_noise`` (OpenDP's takes ~10 µs a cell).
FAST_NOISE_CELLS = 1_000


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
        return _privacy_map(self.scale, self.sensitivity)

    def sample(self, size: int) -> list[int]:
        """``size`` independent zero-centred integer noise draws; long vectors from the
        vectorised sampler of the same distribution (``fast_noise``)."""
        if size == 0:
            return []
        exact = exact_scale(self.scale) if size >= FAST_NOISE_CELLS else None
        if exact is not None:
            return discrete_laplace(*exact, size).tolist()
        return list(_vector_measurement(self.scale)([0] * size))

    def half_width(self, alpha: float) -> float:
        """Half-width of an interval that holds the noise with probability ≥ 1-alpha, in
        released units."""
        accuracy = discrete_laplacian_scale_to_accuracy(self.scale, alpha)
        if not math.isfinite(accuracy):
            # OpenDP's formula underflows at scales below ~1e-3, where a draw is
            # non-zero with probability about 2e**-1000: the interval is the point.
            accuracy = 0.0
        units = math.floor(accuracy)
        return units * self.granularity


def calibrate(sensitivity: int, epsilon: float, granularity: float = 1.0) -> LaplaceNoise:
    """The smallest scale whose OpenDP privacy map stays within ``epsilon``.

    The map is OpenDP's, not ours: we start from Δ/ε and step the scale up
    by ulps until OpenDP's own (conservatively rounded) map agrees.
    """
    if sensitivity < 0 or sensitivity > _I64_MAX:
        raise ValueError("sensitivity out of the range OpenDP's integer Laplace accepts")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    if sensitivity == 0:
        # A constant release needs no noise; a tiny scale keeps the type uniform.
        return LaplaceNoise(0, 0.0, granularity)
    scale = sensitivity / epsilon
    if not scale <= MAX_SCALE:
        raise Refused(
            f"ε = {epsilon:g} is too small for this aggregate's declared bounds: its noise "
            "could not be sampled exactly; ask for a larger ε or declare narrower bounds"
        )
    while _privacy_map(scale, sensitivity) > epsilon:
        scale = math.nextafter(scale, math.inf)
    return LaplaceNoise(sensitivity, scale, granularity)


def _privacy_map(scale: float, sensitivity: int) -> float:
    if sensitivity == 0:
        return 0.0
    return _scalar_measurement(scale).map(sensitivity)


@lru_cache(maxsize=256)
def _vector_measurement(scale: float) -> dp.Measurement:
    return dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64"), scale=scale
    )


@lru_cache(maxsize=256)
def _scalar_measurement(scale: float) -> dp.Measurement:
    return dp.m.make_laplace(dp.atom_domain(T="i64"), dp.absolute_distance(T="i64"), scale=scale)
