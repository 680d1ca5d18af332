"""``COUNT(DISTINCT x)``: one noisy count of the distinct values per partition; of
distinct privacy units where ``x`` is the unit, which a unit adds one to in each
partition it reaches (``dp.counts.distinct_units``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.failures import required
from dpmagic.gate.sql.aggregates.base import SingleMeasured
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.noisy_sql import at_least, noisy
from dpmagic.gate.sql.aggregates.parts import Measured, Parts, Wanted, narrowed
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.trees import display
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.sql.plan_types import Plan
    from dpmagic.gate.sql.resolve import Resolved


class CountDistinct(SingleMeasured):
    func = AggregateFunc.COUNT_DISTINCT
    bounded = False

    def parts(
        self,
        arg: exp.Expression | None,
        clamp: ValueRange | None,
        resolved: Resolved,
        debiased: bool,
        level: float | None,
    ) -> list[Wanted]:
        arg = required(arg, "a distinct count's argument")
        kind = MeasureKind.COUNT_UNIT if resolved.is_unit(arg) else MeasureKind.COUNT_DISTINCT
        return [Wanted(kind, arg, None, f"COUNT(DISTINCT {display(arg)})")]

    def typed(self, names: tuple[str, ...], clamp: ValueRange | None) -> Parts:
        (name,) = names
        return Measured(name)

    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        return at_least(noisy(narrowed(parts, Measured).name), 0)


COUNT_DISTINCT = CountDistinct()
