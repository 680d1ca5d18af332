"""``SUM(x)``: one noisy sum of ``x`` clamped into its declared bounds. A sum of a
randomized-response column is measured with the count of its answers, which
debiasing reads (``sql/randomized.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.failures import required
from dpmagic.gate.sql.aggregates.base import SingleMeasured, count_of_values, sum_of
from dpmagic.gate.sql.aggregates.debiasing import (
    Debias,
    Debiased,
    Debiasing,
    Values,
    answers,
    sums,
)
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.noisy_sql import noisy
from dpmagic.gate.sql.aggregates.parts import DebiasedSum, Measured, Parts, Wanted, narrowed
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.sql.plan_types import Plan
    from dpmagic.gate.sql.resolve import Resolved


class Sum(SingleMeasured):
    func = AggregateFunc.SUM
    summed = True
    debiasing = Debiasing.PER_VALUE

    def parts(
        self,
        arg: exp.Expression | None,
        clamp: ValueRange | None,
        resolved: Resolved,
        debiased: bool,
        level: float | None,
    ) -> list[Wanted]:
        arg = required(arg, "a sum's argument")
        total = sum_of(arg, required(clamp, "a sum's bounds"))
        return [total, count_of_values(arg, resolved)] if debiased else [total]

    def typed(self, names: tuple[str, ...], clamp: ValueRange | None) -> Parts:
        return Measured(names[0]) if len(names) == 1 else DebiasedSum(*names)

    def debias(
        self, d: Debias, first: Values, second: Values | None, groups: list[list[int]]
    ) -> Debiased:
        return sums(d, first, answers(second))

    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        # A debiased sum (``DebiasedSum``) is released from its debiased column.
        return noisy(narrowed(parts, Measured).name)


SUM = Sum()
