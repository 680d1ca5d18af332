"""Privacy accountants: what a query costs and how costs add up.

Three accountants, chosen per dataset in the policy:

- ``pure``: ε-DP, basic composition (ε adds up); Laplace noise.
- ``approx``: (ε, δ)-DP, basic composition (ε and δ add up); Laplace noise,
  or Gaussian where a measurement's share of δ makes it more accurate.
- ``zcdp``: ρ-zero-concentrated DP (Bun and Steinke 2016); Gaussian noise, ρ
  adds up, and every amount is shown to users in (ε, δ) through OpenDP's own
  conversion (``make_zCDP_to_approxDP``) at the budget's δ. A query asked for
  at (ε, δ) costs the largest ρ whose conversion is within (ε, δ).

Every charge carries all three amounts, each a sound bound on the same
release (a pure charge of ε is also ε²/2-zCDP; an approximate one with δ > 0
has no finite ρ), so a dataset whose accountant is changed keeps every past
charge counted. Composition is a sum in every unit; the accountant decides
which unit a limit is checked in. A cost is a function of the query and the
policy only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Protocol

from opendp import combinators, measurements
from opendp.domains import atom_domain
from opendp.measures import zero_concentrated_divergence
from opendp.metrics import discrete_distance
from opendp.mod import PrivacyProfile, enable_features

from dpmagic.gate.dp.group_privacy import approx_group, pure_group, zcdp_group
from dpmagic.gate.policy import AccountantKind, Budget

enable_features("contrib", "honest-but-curious")

# Float sums of many ε may drift by a few ulps; a spend this close to the limit
# is treated as fitting so that ten queries of 0.1 fit a budget of 1.0.
_SLACK = 1e-9
_SEARCH_STEPS = 80


@dataclass(frozen=True)
class Cost:
    """The privacy loss of one release: (ε, δ) and ρ, each a sound bound on it."""

    epsilon: float
    delta: float = 0.0
    rho: float = 0.0

    def as_dict(self) -> dict[str, float]:
        out = {"epsilon": self.epsilon, "delta": self.delta}
        if self.rho and math.isfinite(self.rho) and self.delta:
            out["rho"] = self.rho
        return out


class AccountantError(ValueError):
    """A requested (ε, δ) the accountant cannot honour."""


class Accountant(Protocol):
    name: str
    gaussian: bool  # whether its measurements are calibrated in ρ

    def query_cost(self, epsilon: float, delta: float) -> Cost:
        """The cost of a query asked for at (ε, δ), for one privacy unit."""

    def share(self, cost: Cost, parts: float) -> Cost:
        """One of ``parts`` equal shares of ``cost``: what one measurement may use
        (``parts`` need not be whole: a weighted share is ``cost`` over total weight
        divided by the weight)."""

    def total(self, parts: Iterable[Cost], delta: float) -> Cost:
        """The cost of releasing measurements of these costs together."""

    def group(self, cost: Cost, k: int) -> Cost:
        """The cost for groups of ``k`` privacy units (group privacy)."""

    def fits(self, spent: Cost, cost: Cost, limit: Budget) -> bool:
        """Whether spending ``cost`` after ``spent`` stays within ``limit``."""

    def view(self, spent: Cost, limit: Budget) -> dict[str, dict[str, float]]:
        """``spent``, ``limit`` and ``remaining`` as users read them, (ε, δ) first."""

    def describe(self, cost: Cost) -> str:
        """A cost for a one-line message."""


def compose(costs: Iterable[Cost]) -> Cost:
    """Sequential composition: each unit adds up (basic composition for (ε, δ), the
    zCDP composition theorem for ρ); ``Composition`` of ``costs``."""
    return Composition(costs).total()


class Composition:
    """Sequential composition of a stream of charges, as budgets add them up across
    queries (the ledger's tallies) and ``compose`` within one: ε, δ and ρ each add up
    (Dwork and Roth 2014, Theorem 3.16; Bun and Steinke 2016, Lemma 1.7), whatever the
    order, the same under every accountant; the accountant only decides which of them
    a limit is checked in (``fits``).

    Each sum is kept exact and rounded once when read, so a total read after ``n``
    charges is ``math.fsum`` of them (correctly rounded) and never drifts with ``n``: ten
    charges of 0.1 read as ``math.fsum([0.1] * 10)``, and a budget's standing does not
    depend on how often it was read. Memory is constant: one rational per unit, plus
    the non-finite amounts seen (an approximate charge's ρ is ``inf``)."""

    def __init__(self, costs: Iterable[Cost] = ()) -> None:
        self._amounts = (_ExactSum(), _ExactSum(), _ExactSum())
        for cost in costs:
            self.add(cost)

    def add(self, cost: Cost) -> None:
        for amount, value in zip(self._amounts, (cost.epsilon, cost.delta, cost.rho), strict=True):
            amount.add(value)

    def total(self) -> Cost:
        epsilon, delta, rho = (amount.value() for amount in self._amounts)
        return Cost(epsilon, delta, rho)


class _ExactSum:
    """A running sum of floats, read as ``math.fsum`` of every value added (the exact sum,
    rounded once), in constant memory: an exact rational, plus the non-finite values."""

    def __init__(self) -> None:
        self._exact = Fraction(0)
        self._special: set[float] = set()

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self._exact += Fraction(value)
        else:
            self._special.add(value)

    def value(self) -> float:
        return math.fsum(self._special) if self._special else float(self._exact)


class PureAccountant:
    """ε-differential privacy with basic composition: costs add up."""

    name = AccountantKind.PURE
    gaussian = False

    def query_cost(self, epsilon: float, delta: float) -> Cost:
        _check_epsilon(epsilon)
        if delta:
            raise AccountantError(
                "this dataset uses the pure (ε-only) accountant: ask with delta = 0"
            )
        return pure_cost(float(epsilon))

    def share(self, cost: Cost, parts: float) -> Cost:
        return pure_cost(cost.epsilon / parts)

    def total(self, parts: Iterable[Cost], delta: float) -> Cost:
        return pure_cost(math.fsum(p.epsilon for p in parts))

    def group(self, cost: Cost, k: int) -> Cost:
        return pure_cost(pure_group(cost.epsilon, k))

    def fits(self, spent: Cost, cost: Cost, limit: Budget) -> bool:
        return _fits_basic(spent, cost, limit)

    def view(self, spent: Cost, limit: Budget) -> dict[str, dict[str, float]]:
        return _basic_view(spent, limit)

    def describe(self, cost: Cost) -> str:
        return f"ε={cost.epsilon:.6g}" + (f", δ={cost.delta:.3g}" if cost.delta else "")


class ApproxAccountant(PureAccountant):
    """(ε, δ)-differential privacy with basic composition: ε and δ add up."""

    name = AccountantKind.APPROX

    def query_cost(self, epsilon: float, delta: float) -> Cost:
        _check_epsilon(epsilon)
        _check_delta(delta)
        return _approx(float(epsilon), float(delta))

    def share(self, cost: Cost, parts: float) -> Cost:
        return _approx(cost.epsilon / parts, cost.delta / parts)

    def total(self, parts: Iterable[Cost], delta: float) -> Cost:
        parts = list(parts)
        return _approx(math.fsum(p.epsilon for p in parts), math.fsum(p.delta for p in parts))

    def group(self, cost: Cost, k: int) -> Cost:
        """``dp/group_privacy``: (kε, k·e^{(k−1)ε}·δ)."""
        epsilon, delta = approx_group(cost.epsilon, cost.delta, k)
        return Cost(epsilon, delta, zcdp_group(cost.rho, k))


class ZCDPAccountant:
    """ρ-zCDP: ρ adds up; every amount shown in (ε, δ) at the budget's δ."""

    name = AccountantKind.ZCDP
    gaussian = True

    def query_cost(self, epsilon: float, delta: float) -> Cost:
        _check_epsilon(epsilon)
        _check_delta(delta)
        if delta == 0:
            raise AccountantError("the zcdp accountant needs delta > 0 to state a cost in (ε, δ)")
        return Cost(float(epsilon), float(delta), rho_for(float(epsilon), float(delta)))

    def share(self, cost: Cost, parts: float) -> Cost:
        return Cost(0.0, 0.0, cost.rho / parts)

    def total(self, parts: Iterable[Cost], delta: float) -> Cost:
        return self._at(math.fsum(p.rho for p in parts), delta)

    def group(self, cost: Cost, k: int) -> Cost:
        """``dp/group_privacy``: k²ρ."""
        return self._at(zcdp_group(cost.rho, k), cost.delta)

    def fits(self, spent: Cost, cost: Cost, limit: Budget) -> bool:
        return spent.rho + cost.rho <= limit_rho(limit) * (1 + _SLACK)

    def view(self, spent: Cost, limit: Budget) -> dict[str, dict[str, float]]:
        cap = limit_rho(limit)
        used = min(spent.rho, cap) if math.isfinite(spent.rho) else cap
        left = max(0.0, cap - spent.rho) if math.isfinite(spent.rho) else 0.0
        return {
            "spent": {**_shown(used, limit.delta), "rho": used},
            "limit": {"epsilon": limit.epsilon, "delta": limit.delta, "rho": cap},
            "remaining": {**_shown(left, limit.delta), "rho": left},
        }

    def describe(self, cost: Cost) -> str:
        shown = _shown(cost.rho, cost.delta) if cost.delta else None
        text = f"ρ={cost.rho:.6g}"
        return text + (f" (ε={shown['epsilon']:.6g}, δ={cost.delta:.3g})" if shown else "")

    def _at(self, rho: float, delta: float) -> Cost:
        return Cost(rho_to_epsilon(rho, delta) if delta else math.inf, delta, rho)


ACCOUNTANTS: dict[str, type] = {
    AccountantKind.PURE: PureAccountant,
    AccountantKind.APPROX: ApproxAccountant,
    AccountantKind.ZCDP: ZCDPAccountant,
}


def make_accountant(name: str) -> Accountant:
    try:
        return ACCOUNTANTS[name]()
    except KeyError:
        raise AccountantError(
            f"unknown accountant {name!r}; use one of {', '.join(ACCOUNTANTS)}"
        ) from None


def remaining(accountant: Accountant, spent: Cost, limit: Budget) -> Budget:
    """What is left of ``limit`` after ``spent``, never below zero, in (ε, δ)."""
    left = accountant.view(spent, limit)["remaining"]
    return Budget(left["epsilon"], left["delta"])


@lru_cache(maxsize=4096)
def rho_to_epsilon(rho: float, delta: float) -> float:
    """The ε of OpenDP's zCDP → (ε, δ) conversion of ρ at ``delta``."""
    if rho == 0:
        return 0.0
    if not math.isfinite(rho):
        return math.inf
    return _profile(rho).epsilon(delta)


@lru_cache(maxsize=4096)
def rho_for(epsilon: float, delta: float) -> float:
    """The largest ρ whose OpenDP conversion at ``epsilon`` needs at most ``delta``.

    A bisection over ρ on OpenDP's own privacy profile: ρ ≤ ε always, and
    the profile's δ(ε) grows with ρ.
    """
    lo, hi = 0.0, float(epsilon)
    for _ in range(_SEARCH_STEPS):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if _profile(mid).delta(epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    if lo == 0.0:
        raise AccountantError(f"no ρ > 0 is within (ε={epsilon:g}, δ={delta:g})")
    return lo


def limit_rho(limit: Budget) -> float:
    """A budget in (ε, δ) as a zCDP budget: the largest ρ within it."""
    if limit.epsilon == 0 or limit.delta == 0:
        return 0.0
    return rho_for(limit.epsilon, limit.delta)


def _profile(rho: float) -> PrivacyProfile:
    meas = measurements.make_user_measurement(
        atom_domain(T=bool),
        discrete_distance(),
        zero_concentrated_divergence(),
        lambda x: x,
        lambda _d_in: rho,
    )
    return combinators.make_zCDP_to_approxDP(meas).map(1)


def _shown(rho: float, delta: float) -> dict[str, float]:
    if rho == 0:
        return {"epsilon": 0.0, "delta": 0.0}
    return {"epsilon": rho_to_epsilon(rho, delta), "delta": delta}


def pure_cost(epsilon: float) -> Cost:
    """A pure ε-DP mechanism's cost in every unit: ε, δ = 0, and ρ = ε²/2 (ε-DP implies
    ε²/2-zCDP, Bun and Steinke 2016, Proposition 1.4)."""
    return Cost(epsilon, 0.0, epsilon * epsilon / 2)


def _approx(epsilon: float, delta: float) -> Cost:
    return Cost(epsilon, delta, epsilon * epsilon / 2 if delta == 0 else math.inf)


def _fits_basic(spent: Cost, cost: Cost, limit: Budget) -> bool:
    total = compose([spent, cost])
    return total.epsilon <= limit.epsilon + _SLACK and total.delta <= limit.delta + _SLACK * 1e-6


def _basic_view(spent: Cost, limit: Budget) -> dict[str, dict[str, float]]:
    return {
        "spent": {"epsilon": spent.epsilon, "delta": spent.delta},
        "limit": {"epsilon": limit.epsilon, "delta": limit.delta},
        "remaining": {
            "epsilon": max(0.0, limit.epsilon - spent.epsilon),
            "delta": max(0.0, limit.delta - spent.delta),
        },
    }


def _check_epsilon(epsilon: float) -> None:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise AccountantError("epsilon must be a positive finite number")


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, int | float) and 0 <= delta < 1):
        raise AccountantError("delta must be at least 0 and below 1")
