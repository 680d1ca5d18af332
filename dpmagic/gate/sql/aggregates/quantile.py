"""``MIN``, ``MAX``, ``MEDIAN`` and the percentiles: a quantile at a level (0, 1, 0.5,
or the fraction the call names), released by an exponential-mechanism selection per
partition from its argument's values snapped to a grid of its declared bounds
(``dp.quantile_selection``), which ``plan.py`` makes with its interval's two ends
(``edges``) and a count of its argument to judge it by. A ``MIN`` is never the data's
smallest value: it is the DP quantile at 0."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.aggregates.base import Selecting
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.noisy_sql import noisy
from dpmagic.gate.sql.aggregates.parts import Measured, Parts, narrowed
from dpmagic.gate.sql.parse import DIALECT

if TYPE_CHECKING:
    from dpmagic.gate.sql.dominance import Rule
    from dpmagic.gate.sql.intervals import Bounds, CellIntervals
    from dpmagic.gate.sql.plan_types import Plan

# The level of the quantiles whose SQL function names it.
FIXED_LEVELS: dict[type[exp.Expression], float] = {exp.Min: 0.0, exp.Max: 1.0, exp.Median: 0.5}


class Quantile(Selecting):
    func = AggregateFunc.QUANTILE

    def level(self, node: exp.Expression) -> float:
        fixed = FIXED_LEVELS.get(type(node))
        if fixed is not None:
            return fixed
        q = node.args.get("quantile") or node.args.get("expression")
        if isinstance(q, exp.Order):  # quantile_cont(x, q ORDER BY x)
            q = q.this
        return fraction(q, node.sql(dialect=DIALECT))

    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        return noisy(narrowed(parts, Measured).name)

    def interval(
        self, cells: CellIntervals, name: str, parts: Parts, pid: int, alpha: float
    ) -> Bounds | None:
        return cells.edges(cells.plan.selection(narrowed(parts, Measured).name), pid, alpha)

    def dominance(self, plan: Plan, name: str, parts: Parts) -> Rule:
        return "percentiles", plan.selection(narrowed(parts, Measured).name)


def fraction(q: exp.Expression | None, label: str) -> float:
    """The literal level ``q`` of the quantile written ``label``, refused unless it is one
    number between 0 and 1."""
    if not (isinstance(q, exp.Literal) and not q.is_string) or not 0 <= float(q.this) <= 1:
        raise Refused(f"{label}: the quantile must be one number between 0 and 1")
    return float(q.this)


QUANTILE = Quantile()
