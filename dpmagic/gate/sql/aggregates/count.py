"""``COUNT(*)`` and ``COUNT(x)``: one noisy count per partition. ``COUNT(DISTINCT x)``
is its own kind (``count_distinct``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.sql.aggregates.base import Kind, SingleMeasured, count_of
from dpmagic.gate.sql.aggregates.count_distinct import COUNT_DISTINCT
from dpmagic.gate.sql.aggregates.debiasing import Debias, Debiased, Debiasing, Values, counts
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.noisy_sql import at_least, noisy
from dpmagic.gate.sql.aggregates.parts import Measured, Parts, Wanted, narrowed
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.sql.plan_types import Plan
    from dpmagic.gate.sql.resolve import Resolved


class Count(SingleMeasured):
    func = AggregateFunc.COUNT
    star = True
    distinct: Kind | None = COUNT_DISTINCT
    bounded = False
    debiasing = Debiasing.PER_ANSWER

    def parts(
        self,
        arg: exp.Expression | None,
        clamp: ValueRange | None,
        resolved: Resolved,
        debiased: bool,
        level: float | None,
    ) -> list[Wanted]:
        return [count_of(arg)]

    def typed(self, names: tuple[str, ...], clamp: ValueRange | None) -> Parts:
        (name,) = names
        return Measured(name)

    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        return at_least(noisy(narrowed(parts, Measured).name), 0)

    def debias(
        self, d: Debias, first: Values, second: Values | None, groups: list[list[int]]
    ) -> Debiased:
        return counts(d, first, groups)

    def released_debiased(self, column: exp.Column) -> exp.Expression:
        return at_least(column, 0)


COUNT = Count()
