"""Privacy accountants: what a query costs and how costs add up.

The ledger stores costs in the accountant's own units and asks the accountant
to compose them, so a new accountant (approximate DP, zCDP) needs no change to
the ledger. A cost is a function of the query and the policy only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from dpmagic.gate.policy import Budget

# Float sums of many ε may drift by a few ulps; a spend this close to the limit
# is treated as fitting so that ten queries of 0.1 fit a budget of 1.0.
_SLACK = 1e-9


@dataclass(frozen=True)
class Cost:
    """The privacy loss of one release, in the accountant's units."""

    epsilon: float
    delta: float = 0.0
    rho: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta}


ZERO = Cost(0.0, 0.0, 0.0)


class AccountantError(ValueError):
    """A requested (ε, δ) the accountant cannot honour."""


class Accountant(Protocol):
    name: str

    def query_cost(self, epsilon: float, delta: float) -> Cost:
        """The cost of a query asked for at (ε, δ)."""

    def compose(self, costs: Iterable[Cost]) -> Cost:
        """The total privacy loss of a sequence of releases."""

    def as_budget(self, cost: Cost) -> Budget:
        """A cost in the (ε, δ) terms users and limits speak."""

    def fits(self, spent: Cost, cost: Cost, limit: Budget) -> bool:
        """Whether spending ``cost`` after ``spent`` stays within ``limit``."""


class PureAccountant:
    """ε-differential privacy with basic composition: costs add up."""

    name = "pure"

    def query_cost(self, epsilon: float, delta: float) -> Cost:
        if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
            raise AccountantError("epsilon must be a positive finite number")
        if delta:
            raise AccountantError(
                "this dataset uses the pure (ε-only) accountant: ask with delta = 0"
            )
        return Cost(float(epsilon), 0.0)

    def compose(self, costs: Iterable[Cost]) -> Cost:
        costs = list(costs)
        return Cost(math.fsum(c.epsilon for c in costs), math.fsum(c.delta for c in costs))

    def as_budget(self, cost: Cost) -> Budget:
        return Budget(cost.epsilon, cost.delta)

    def fits(self, spent: Cost, cost: Cost, limit: Budget) -> bool:
        total = self.compose([spent, cost])
        return total.epsilon <= limit.epsilon + _SLACK and total.delta <= limit.delta + _SLACK


def make_accountant(name: str) -> Accountant:
    if name == "pure":
        return PureAccountant()
    raise AccountantError(f"accountant {name!r} is not available yet; use 'pure'")


def remaining(accountant: Accountant, spent: Cost, limit: Budget) -> Budget:
    """What is left of ``limit`` after ``spent``, never below zero."""
    used = accountant.as_budget(spent)
    return Budget(max(0.0, limit.epsilon - used.epsilon), max(0.0, limit.delta - used.delta))
