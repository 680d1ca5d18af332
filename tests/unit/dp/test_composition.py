"""``dp/composition`` and the split of ``dp/shares``: over plan shapes of every kind
(aggregates of every weight, quantiles with and without their interval's ends, keys
chosen from the data, a bounding report), under each accountant, the parts' shares as
the plan pass hands them out (``shares.part_share``, ``composition.pure_cost``,
``left_out.report_cost``) compose to the query's charge: never above it, and less than
one part in 10^9 below it, so nothing is lost either. A split whose total weight
forgets a part (the ends of a quantile's interval) is refused (the last test)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest

from dpmagic.gate.dp.accounting import (
    Accountant,
    ApproxAccountant,
    Cost,
    PureAccountant,
    ZCDPAccountant,
)
from dpmagic.gate.dp.calibration import Target
from dpmagic.gate.dp.composition import composes, pure_cost
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.left_out import report_cost, report_weight
from dpmagic.gate.dp.shares import (
    EDGE_WEIGHT,
    measurement_weight,
    part_share,
    total_weight,
)
from dpmagic.gate.policy import Neighbouring
from dpmagic.gate.sql.aggregates.base import Measuring
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.registry import kind_of

ACCOUNTANTS = [PureAccountant(), ApproxAccountant(), ZCDPAccountant()]
# An aggregate: its function, how many measurements it is made of, whether its sums
# are centred (an AVG's, a variance's); each may share its count with another.
AGGREGATES = [
    (AggregateFunc.COUNT, 1, False),
    (AggregateFunc.SUM, 1, False),
    (AggregateFunc.AVG, 2, True),
    (AggregateFunc.VAR_POP, 3, True),
]
CONTRIBUTIONS = [Contribution.bounded(1, 1, 3), Contribution.bounded(2, 3, 5)]
REPORTS = [None, 0.05, 0.5, 0.9]
Total = Callable[..., float]


def _weights(aggregates, c: Contribution, neighbouring: str, gaussian: bool) -> list[float]:
    """The measurements' weights of a plan of these aggregates, each measurement once;
    an AVG and a variance read the first's count (as the plan registers a ``COUNT`` of
    one argument once), and a quantile's added count is read by none."""
    demands: dict[str, list[float]] = {"count": [], "quantile count": []}
    for i, (func, parts, centred) in enumerate(aggregates):
        kind = kind_of(func)
        assert isinstance(kind, Measuring)
        given = kind.weights(parts, centred, c, neighbouring, gaussian)
        names = [f"{i}.{k}" for k in range(parts)]
        if func == "avg":
            names[1] = "count"
        elif func == "var_pop":
            names[0] = "count"
        for name, weight in zip(names, given, strict=True):
            demands.setdefault(name, []).append(weight)
    return [measurement_weight(ws) for ws in demands.values()]


def _spent(
    accountant: Accountant,
    asked: Cost,
    weights: list[float],
    quantiles: int,
    edges: bool,
    private: bool,
    report: float | None,
    total_of: Total = total_weight,
) -> list[Cost]:
    """Each part's cost as the plan pass gives it out: a measurement and a partition
    selection their share, a quantile and each end of its interval a pure ε of theirs,
    the bounding report its charge."""
    total = total_of(weights, quantiles, edges, private)
    reported = 0.0 if report is None else report_weight(total, report)
    total += reported

    def share(weight: float) -> Cost:
        return part_share(accountant, asked, total, weight)

    costs = [share(w) for w in weights] + ([share(1.0)] if private else [])
    for _ in range(quantiles):
        ends = [EDGE_WEIGHT] * 2 if edges else []
        for weight in (1.0, *ends):
            costs.append(pure_cost(Target(accountant, share=share(weight)).pure_epsilon()))
    if report is not None:
        costs.append(report_cost(accountant, asked, total, reported))
    return costs


def _shapes(gaussian: bool):
    for n in range(3):
        for aggregates in itertools.combinations_with_replacement(AGGREGATES, n):
            for c, relation in itertools.product(CONTRIBUTIONS, list(Neighbouring)):
                weights = _weights(aggregates, c, relation, gaussian)
                for quantiles, edges, private, report in itertools.product(
                    range(3), (False, True), (False, True), REPORTS
                ):
                    if weights or quantiles or private:
                        yield weights, quantiles, edges, private, report


def _asked(accountant: Accountant, epsilon: float) -> Cost:
    return accountant.query_cost(epsilon, 0.0 if accountant.name == "pure" else 1e-6)


@pytest.mark.parametrize("epsilon", [0.1, 3.0])
@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
def test_every_plan_shape_composes_to_its_charge(accountant, epsilon):
    asked = _asked(accountant, epsilon)
    shapes = 0
    for shape in _shapes(accountant.gaussian):
        costs = _spent(accountant, asked, *shape)
        composes(accountant, asked, costs)  # never above the charge
        unit = (lambda c: c.rho) if accountant.gaussian else (lambda c: c.epsilon)
        spent = math.fsum(unit(c) for c in costs)
        assert spent >= unit(asked) * (1 - 1e-9), shape  # and nothing lost
        shapes += 1
    assert shapes > 1000


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
def test_a_part_over_the_charge_is_refused(accountant):
    asked = _asked(accountant, 1.0)
    over = accountant.share(asked, 1 / (1 + 1e-6))
    with pytest.raises(RuntimeError, match="cost more than its charge"):
        composes(accountant, asked, [over])


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
def test_a_total_that_forgets_the_interval_ends_is_refused(accountant):
    """The broken split: a quantile's interval ends get their share, but the total
    weight counts only the quantile; the parts then spend more than the charge."""

    def forgetful(weights, quantiles, edges, private):
        return total_weight(weights, quantiles, False, private)

    asked = _asked(accountant, 1.0)
    with pytest.raises(RuntimeError, match="cost more than its charge"):
        composes(accountant, asked, _spent(accountant, asked, [1.0], 1, True, False, None,
                                           forgetful))  # fmt: skip
