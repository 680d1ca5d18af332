"""``AVG(x)``: a noisy sum of ``x`` over a noisy count of the same rows. The sum is
measured around the middle of its values' range (``plan_types.Centre``,
``dp.centred_sums``), which halves its noise; the average is then the centre plus the
centred sum over the count. A debiased average keeps its raw sum, which debiasing
reads. Its two parts share the budget by their part in its error
(``dp.shares.avg_weights``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.dp.shares import avg_weights
from dpmagic.gate.failures import required
from dpmagic.gate.sql.aggregates.base import Measuring, count_of_values, sum_of
from dpmagic.gate.sql.aggregates.debiasing import (
    Debias,
    Debiased,
    Debiasing,
    Values,
    answers,
    averages,
)
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.noisy_sql import at_least, literal, noisy, within_sql
from dpmagic.gate.sql.aggregates.parts import Avg, Parts, Wanted, narrowed
from dpmagic.gate.sql.expected import average_error
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.sql.dominance import Expected, Rule
    from dpmagic.gate.sql.intervals import Bounds, CellIntervals
    from dpmagic.gate.sql.plan_types import Plan
    from dpmagic.gate.sql.resolve import Resolved


class Average(Measuring):
    func = AggregateFunc.AVG
    summed = True
    debiasing = Debiasing.PER_VALUE
    centred_weights = avg_weights

    def parts(
        self,
        arg: exp.Expression | None,
        clamp: ValueRange | None,
        resolved: Resolved,
        debiased: bool,
        level: float | None,
    ) -> list[Wanted]:
        arg = required(arg, "an average's argument")
        total = sum_of(arg, required(clamp, "an average's bounds"))
        count = count_of_values(arg, resolved)
        return [total, count] if debiased else [total._replace(counted=1), count]

    def typed(self, names: tuple[str, ...], clamp: ValueRange | None) -> Parts:
        return Avg(*names)

    def debias(
        self, d: Debias, first: Values, second: Values | None, groups: list[list[int]]
    ) -> Debiased:
        return averages(d, first, answers(second))

    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        """Its centre plus its centred sum over its count, within its bounds."""
        avg = narrowed(parts, Avg)
        total = plan.measurement(avg.total)
        mean = literal(total.centre_value) + noisy(avg.total) / at_least(noisy(avg.count), 1)
        return within_sql(mean, literal(total.bounds.lo), literal(total.bounds.hi))

    def expected(self, plan: Plan, name: str, parts: Parts) -> Expected | None:
        # A debiased average's error is its estimate's (``randomized``), known after it runs.
        return None if name in plan.debiased else (average_error, narrowed(parts, Avg), False)

    def interval(
        self, cells: CellIntervals, name: str, parts: Parts, pid: int, alpha: float
    ) -> Bounds | None:
        return cells.means(name, narrowed(parts, Avg), alpha)[pid]

    def dominance(self, plan: Plan, name: str, parts: Parts) -> Rule:
        """Judged by its range, floored at its expected error."""
        avg = narrowed(parts, Avg)
        total, count = plan.measurement(avg.total), plan.measurement(avg.count)
        floor = self.expected(plan, name, parts)
        return "range", (total.bounds.lo, total.bounds.hi, count, floor)


AVG = Average()
