"""Rule: what a plan's noisy parts cost one unit together, and the check that this is
no more than the query is charged.

Each part costs what its noise was calibrated to: a measurement its ``Cost``
(``calibration.spent``), a quantile's selection and each end of its interval a pure
ε, which is also ε²/2-zCDP (Bun and Steinke 2016, Proposition 1.4; ``pure_cost``,
defined beside ``Cost`` in ``accounting``, whose pure accountant charges by it
too), a partition selection its (ε, δ), the bounding report its charge
(``left_out``).
Under sequential composition these add up: ε and δ under ``pure`` and ``approx``
(basic composition), ρ under ``zcdp``. So a plan whose parts add up to at most the
query's charge spends no more than it is debited, whatever the shares, weights and
roundings that made them (``shares``); ``composes`` refuses any other plan as the
gate's own bug, before anything runs.

``tests/unit/dp/test_composition.py`` enumerates plan shapes (aggregates of every
weight, quantiles with and without their interval, chosen keys, a bounding report)
under the three accountants: their shares compose to the charge, no less than
one part in 10^9 below it, and a split that forgets a part is refused.
"""

from __future__ import annotations

import math

from dpmagic.gate.dp.accounting import Accountant, Cost, pure_cost

__all__ = ["SLACK", "composes", "pure_cost"]

SLACK = 1 + 1e-9
"""Float sums of the parts may pass the charge by this factor (roundings only)."""


def composes(accountant: Accountant, asked: Cost, parts: list[Cost]) -> None:
    """Refuse, as the gate's own bug, a plan whose parts together cost one unit more
    than the query is charged (by the accountants' composition: ε and δ add up under
    ``pure`` and ``approx``, ρ under ``zcdp``): whatever the shares, weights and
    roundings, a reply never spends more than its debit."""
    if accountant.gaussian:  # ρ adds up (read as ρ: converting to ε overflows at huge ε)
        over = math.fsum(p.rho for p in parts) > asked.rho * SLACK
    else:
        epsilon, delta = math.fsum(p.epsilon for p in parts), math.fsum(p.delta for p in parts)
        over = epsilon > asked.epsilon * SLACK or delta > asked.delta * SLACK
    if over:
        raise RuntimeError("internal error: the plan's parts cost more than its charge")
