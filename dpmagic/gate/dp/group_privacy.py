"""Rule: what a mechanism costs for groups of ``k`` privacy units (``group_size``).

Neighbours at distance ``k`` are reached by ``k`` steps of distance 1.

- Pure ε-DP: each step multiplies the probability of any event by at most ``e^ε``:
  ``kε`` (Dwork and Roth 2014, Theorem 2.2).
- Approximate (ε, δ)-DP: the ``i``-th step adds ``δ`` scaled by the ``e^{(i−1)ε}``
  the earlier steps allow: ``(kε, k·e^{(k−1)ε}·δ)`` (Vadhan 2017, Lemma 2.2).
- ρ-zCDP: ``k²ρ`` (Bun and Steinke 2016, Proposition 1.9).
"""

from __future__ import annotations

import math


def pure_group(epsilon: float, k: int) -> float:
    return k * epsilon


def approx_group(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    return k * epsilon, k * math.exp((k - 1) * epsilon) * delta


def zcdp_group(rho: float, k: int) -> float:
    return k * k * rho
