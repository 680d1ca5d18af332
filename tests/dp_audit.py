"""An empirical privacy audit: lower bounds on ε from samples of a mechanism.

For any event S, an ε-DP mechanism M and neighbouring datasets D, D' satisfy
``P[M(D) ∈ S] <= e^ε P[M(D') ∈ S]`` and the same with D and D' swapped. From
``n`` samples on each side, Clopper-Pearson intervals give a lower bound on
``P[M(D) ∈ S]`` and an upper bound on ``P[M(D') ∈ S]``; their log ratio is a
lower bound on the true ε that holds with probability at least ``1 - alpha``.
A bound above the claimed ε therefore proves (at that confidence) that the
mechanism spends more than it charges; a correct mechanism exceeds it with
probability at most ``alpha``.

The event is fixed before sampling, from the datasets and the mechanism's
design (a tail at the value on D), so choosing it spends none of ``alpha``.
Both S and its complement are tried, so ``alpha`` is split over four
one-sided intervals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy.stats import beta

ALPHA = 1e-3


def cp_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound on a binomial proportion."""
    return 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))


def cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound on a binomial proportion."""
    return 1.0 if k == n else float(beta.ppf(1 - alpha, k + 1, n - k))


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower_bound: float
    hits_d: int
    hits_d_prime: int
    n_d: int
    n_d_prime: int

    def __str__(self) -> str:
        return (
            f"ε ≥ {self.epsilon_lower_bound:.3f} "
            f"(event in {self.hits_d}/{self.n_d} on D, {self.hits_d_prime}/{self.n_d_prime} on D')"
        )


def epsilon_lower_bound(
    on_d: Sequence[object],
    on_d_prime: Sequence[object],
    event: Callable[[object], bool],
    alpha: float = ALPHA,
) -> AuditResult:
    """The ε lower bound that ``event`` proves from outputs sampled on D and D'."""
    n, m = len(on_d), len(on_d_prime)
    k = sum(1 for out in on_d if event(out))
    j = sum(1 for out in on_d_prime if event(out))
    a = alpha / 4
    bounds = [0.0]
    # S: P_D[S] / P_D'[S]; the complement: P_D'[not S] / P_D[not S].
    for (hits, size), (other_hits, other_size) in (((k, n), (j, m)), ((m - j, m), (n - k, n))):
        low = cp_lower(hits, size, a)
        high = cp_upper(other_hits, other_size, a)
        if low > 0:
            bounds.append(math.log(low / high))
    return AuditResult(max(bounds), k, j, n, m)
