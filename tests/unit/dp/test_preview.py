"""``dp/preview``: the number of queries of one cost that fit the budgets that apply is
the number the accountant lets through one after another, as the ledger checks them;
and ``n`` copies of a cost composed at once are ``compose`` of the list of them."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import astuple
from fractions import Fraction

import pytest

from dpmagic.gate.dp.accounting import (
    Accountant,
    ApproxAccountant,
    Cost,
    PureAccountant,
    ZCDPAccountant,
    compose,
)
from dpmagic.gate.dp.preview import Standing, queries_that_fit, repeated
from dpmagic.gate.policy import Budget

ACCOUNTANTS = [PureAccountant(), ApproxAccountant(), ZCDPAccountant()]


def next_fits(accountant: Accountant, standings: list[Standing], cost: Cost, k: int) -> bool:
    """Whether the ledger lets one more query of ``cost`` through after ``k`` of them:
    each scope's spending with ``k`` charges added, kept exact and rounded once as the
    ledger keeps it (``accounting.Composition``), then ``fits`` for the next (``ledger.debit``).
    Once it is false it stays false (spending only grows), so the ledger lets through
    ``n`` queries exactly when this holds after ``n - 1`` and not after ``n``."""

    def charged(spent: Cost) -> Cost:
        return Cost(*(_exact(a, b, k) for a, b in zip(astuple(spent), astuple(cost), strict=True)))

    return all(accountant.fits(charged(spent), cost, limit) for spent, limit in standings)


def let_through(accountant: Accountant, standings: list[Standing], cost: Cost, n: int) -> bool:
    """Whether the ledger, checking one query at a time, lets exactly ``n`` through."""
    return (n == 0 or next_fits(accountant, standings, cost, n - 1)) and not next_fits(
        accountant, standings, cost, n
    )


def _exact(spent: float, each: float, k: int) -> float:
    """``spent`` plus ``k`` times ``each``, exact and rounded once (an infinite ρ stays
    infinite: the approx accountant's charges with δ have none)."""
    if not (math.isfinite(spent) and math.isfinite(each)):
        return math.inf if k or not math.isfinite(spent) else spent
    return float(Fraction(spent) + k * Fraction(each))


def cases(accountant: Accountant, seed: int) -> list[tuple[list[Standing], Cost]]:
    """Standings of two budgets, say a user's and a notebook's (either may be the
    tighter, some spent beyond their limit), and costs as the accountant states a
    query's: n from 0 to thousands."""
    rng = random.Random(seed)
    delta = 0.0 if accountant.name == "pure" else 1e-5
    # Few distinct amounts: each new one costs zCDP a search over OpenDP's conversion.
    limits_at = [0.5, 1.0, 2.5, 3.0, 7.3, 10.0]
    epsilons = [0.02, 0.05, 0.1, 0.15, 0.3, 1 / 3, 0.45, 0.7, 1.0, 1.5]
    found = []
    for _ in range(40):
        limits = [Budget(rng.choice(limits_at), delta), Budget(rng.choice(limits_at), delta)]
        query_delta = 0.0 if accountant.name == "pure" else rng.choice([1e-7, 1e-6, 3e-6])
        charges = [accountant.query_cost(rng.choice(epsilons[:5]), query_delta) for _ in limits]
        spent = [compose([c] * rng.randint(0, 8)) for c in charges]
        cost = accountant.query_cost(rng.choice(epsilons), query_delta)
        found.append((list(zip(spent, limits, strict=True)), cost))
    # Exact multiples, where float sums meet the limit: ten of 0.1 fit 1.0.
    exact = accountant.query_cost(0.1, query_delta)
    found.append(([(compose([]), Budget(1.0, 10 * query_delta or delta))] * 2, exact))
    return found


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
def test_as_many_fit_as_the_ledger_lets_through_one_by_one(accountant):
    seen = set()
    for standings, cost in cases(accountant, seed=7):
        n = queries_that_fit(accountant, standings, cost)
        assert let_through(accountant, standings, cost, n), (standings, cost, n)
        # n of them composed fit every scope (if any do), and n + 1 do not fit some scope.
        assert n == 0 or all(accountant.fits(s, repeated(cost, n), lim) for s, lim in standings)
        assert not all(accountant.fits(s, repeated(cost, n + 1), lim) for s, lim in standings)
        seen.add(min(n, 3))
    assert seen == {0, 1, 2, 3}  # none, one, two and more fit, among the cases


def test_the_tighter_scope_decides():
    acc = PureAccountant()
    cost = acc.query_cost(0.25, 0.0)
    roomy, tight = (compose([]), Budget(10.0)), (compose([cost] * 2), Budget(1.0))
    assert queries_that_fit(acc, [roomy, tight], cost) == 2
    assert queries_that_fit(acc, [tight, roomy], cost) == 2
    assert queries_that_fit(acc, [roomy], cost) == 40


def test_delta_can_run_out_first_under_approx():
    acc = ApproxAccountant()
    cost = acc.query_cost(0.1, 1e-6)
    assert queries_that_fit(acc, [(compose([]), Budget(10.0, 3e-6))], cost) == 3


def test_zcdp_counts_in_rho_not_in_epsilon():
    """Under zCDP, ρ adds up: far more queries fit than ε adding up would allow."""
    acc = ZCDPAccountant()
    cost = acc.query_cost(0.5, 1e-6)
    n = queries_that_fit(acc, [(compose([]), Budget(2.0, 1e-6))], cost)
    assert n > 2 / 0.5
    assert let_through(acc, [(compose([]), Budget(2.0, 1e-6))], cost, n)


def test_a_version_off_by_one_is_caught():
    """The check above fails a count one too high or one too low."""
    acc = PureAccountant()
    standings: list[Standing] = [(compose([]), Budget(1.0))]
    cost = acc.query_cost(0.3, 0.0)
    n = queries_that_fit(acc, standings, cost)
    assert n == 3
    for wrong in (n - 1, n + 1):
        assert not let_through(acc, standings, cost, wrong)


def test_a_cost_of_nothing_is_refused():
    with pytest.raises(ValueError, match="without end"):
        queries_that_fit(PureAccountant(), [(compose([]), Budget(1.0))], Cost(0.0))


def test_repeated_is_compose_of_the_list():
    rng = random.Random(3)
    costs = [
        Cost(0.1, 0.0, 0.005),
        Cost(1 / 3, 1e-7, float("inf")),
        Cost(rng.uniform(0, 1), rng.uniform(0, 1e-5), rng.uniform(0, 1)),
        Cost(5e-324, 0.0, 0.0),
        Cost(1e300, 0.0, 1e300),
    ]
    for cost, n in itertools.product(costs, [*range(70), 127, 128, 129, 1000, 1023]):
        assert repeated(cost, n) == compose([cost] * n), (cost, n)
