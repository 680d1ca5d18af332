"""Private group keys: how many one unit can touch (the rule), and their release by
DP partition selection (the mechanism).

**Rule.** With keys read from the data, a key is released when its noisy count of units
passes a threshold. One unit reaches at most ``groups`` keys (the per-query window
keeps it in at most that many partitions) and adds at most 1 to each key's count
of distinct units: ``l0 = groups``, ``l∞ = 1``. A replacement removes one unit's
keys and adds another's, possibly all different: ``l0 = 2·groups``. The noisy
threshold below is calibrated to these.

**Rule: the partition count sensitivities assume** (``chosen_key_partitions``). With keys
read from the data, the released keys are not known before the query runs: a unit and
the unit that replaces it may reach keys that no other unit has, so sensitivities must
count on no overlap between two units' reach. ``dp/sums`` counts on a replacement
sharing at least ``max(0, 2·groups − partitions)`` of its cells with the unit it
replaces; at ``partitions = 2·groups`` that is none, and any larger count gives the
same bounds. So ``2·max_groups`` keys (``max_groups`` the most any bounding lets a unit
reach, at least the contribution's ``groups``) is the least count that is sound, and a
smaller one would let a replacement claim a shared key it need not have
(``tests/unit/dp/test_production.py`` checks the bounds against units over more keys
than that, by brute force).

**Mechanism.** When a ``GROUP BY`` key's values are not public, the keys themselves come
from the data, and releasing one that only a single person has would give
that person away. Each key seen in the bounded rows is therefore released
only if its count of privacy units, plus discrete Laplace noise, reaches a
threshold: OpenDP's ``make_laplace_threshold`` (Rogers 2023, "A unifying
privacy analysis framework for unknown domain algorithms"), whose privacy
map gives (ε, δ) for how far one unit can move the map of counts. A key
absent from the data has no count and is never released; a rare one is
released with probability at most δ.

One unit moves the map of per-key unit counts by at most: ``l0`` keys (the
``groups`` it may reach after contribution bounding, twice that when it is
replaced by another), ``linf = 1`` in each (a unit is counted once per key),
and so ``l1 = l0`` in all. The scale is the least whose OpenDP ε is within
the share; the threshold the least whose OpenDP δ is within the share's δ.
Both come from the query and the policy alone.

The noise is drawn with :class:`~dpmagic.gate.dp.mechanisms.LaplaceNoise`, the
same discrete Laplace as OpenDP's measurement (from OpenDP's sampler, or for
long vectors the vectorised one tested equal to it); the rule is OpenDP's:
a key is kept when its noisy count is at least the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from opendp import measurements
from opendp.domains import atom_domain, map_domain
from opendp.metrics import absolute_distance, l01inf_distance
from opendp.mod import Measurement, enable_features

from dpmagic.gate.dp.contribution import Contribution, checked_relation
from dpmagic.gate.dp.mechanisms import MAX_SCALE, LaplaceNoise
from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import Neighbouring

enable_features("contrib")

LAPLACE_THRESHOLD = "laplace_threshold"
_MAX_THRESHOLD = 2**62


@dataclass(frozen=True)
class KeySelection:
    """Keep a key when ``count + noise >= threshold``; ``l0``/``linf`` say how far one
    unit moves the counts, ``epsilon``/``delta`` what OpenDP's map proves for it."""

    l0: int
    linf: int
    scale: float
    threshold: int
    epsilon: float
    delta: float

    @property
    def mechanism(self) -> str:
        return LAPLACE_THRESHOLD

    def keep(self, counts: list[int]) -> list[bool]:
        """Which of these exact unit counts pass the noisy threshold."""
        draws = LaplaceNoise(self.l0 * self.linf, self.scale).sample(len(counts))
        return [c + d >= self.threshold for c, d in zip(counts, draws, strict=True)]


def calibrate_selection(l0: int, linf: int, epsilon: float, delta: float) -> KeySelection:
    """The least scale within ``epsilon`` and the least threshold within ``delta``, by
    OpenDP's own privacy map of ``make_laplace_threshold``."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    if not 0 < delta < 1:
        raise Refused("private group keys need δ > 0: ask with a delta (for example -d 1e-6)")
    d_in = (l0, l0 * linf, linf)
    scale = l0 * linf / epsilon
    if not scale <= MAX_SCALE:
        raise Refused("the budget share for choosing private keys is too small: ask for more ε")
    while _map(scale, linf, d_in)[0] > epsilon:
        scale = math.nextafter(scale, math.inf)
    lo, hi = linf, linf + 1
    while _map(scale, hi, d_in)[1] > delta:  # grow until δ fits, then bisect
        lo, hi = hi, 2 * hi
        if hi > _MAX_THRESHOLD:
            raise Refused("δ is too small to choose private keys: ask with a larger delta")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _map(scale, mid, d_in)[1] <= delta:
            hi = mid
        else:
            lo = mid
    eps, dlt = _map(scale, hi, d_in)
    return KeySelection(l0, linf, scale, hi, eps, dlt)


@lru_cache(maxsize=1024)
def _map(scale: float, threshold: int, d_in: tuple[int, int, int]) -> tuple[float, float]:
    return _measurement(scale, threshold).map(d_in)


@lru_cache(maxsize=256)
def _measurement(scale: float, threshold: int) -> Measurement:
    return measurements.make_laplace_threshold(
        map_domain(atom_domain(T="i64"), atom_domain(T="i64")),
        l01inf_distance(absolute_distance(T="i64")),
        scale=scale,
        threshold=threshold,
    )


def key_reach(c: Contribution, neighbouring: Neighbouring) -> tuple[int, int]:
    """``(l0, l∞)``: keys one neighbour can touch, and how much it moves each count."""
    relation = checked_relation(neighbouring)
    return c.groups * (2 if relation == Neighbouring.SUBSTITUTE else 1), 1


def chosen_key_partitions(max_groups: int) -> int:
    """The partition count a query's sensitivities assume when its keys are chosen from
    the data (the rule above): ``2·max_groups``, the fewest at which a unit and its
    replacement, each in at most ``max_groups`` keys, may share none."""
    if max_groups < 1:
        raise ValueError("a unit may reach at least one partition")
    return 2 * max_groups
