"""``VAR_SAMP``, ``VAR_POP``, ``STDDEV_SAMP``, ``STDDEV_POP``: from a noisy count and
the noisy sums of the values' distance to the middle of their bounds and of its square
(computed in SQL), both sums measured around the middle of their own ranges in turn:
centring changes the noise, not the variance. The four kinds differ only in dividing
by ``n − 1`` (``sample``) and in releasing the square root (``root``). Their three
parts share the budget by their part in its error (``dp.shares.variance_weights``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.dp.shares import variance_weights
from dpmagic.gate.failures import required
from dpmagic.gate.sql.aggregates.base import Measuring, count_of_values
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.noisy_sql import at_least, literal, noisy, within_sql
from dpmagic.gate.sql.aggregates.parts import Parts, Variance, Wanted, narrowed
from dpmagic.gate.sql.expected import variance_error
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.trees import display
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.sql.dominance import Expected, Rule
    from dpmagic.gate.sql.intervals import Bounds, CellIntervals
    from dpmagic.gate.sql.plan_types import Plan
    from dpmagic.gate.sql.resolve import Resolved


@dataclass(frozen=True, eq=False)
class Spread(Measuring):
    """A variance (``root`` False) or a standard deviation, of a sample or not."""

    func: AggregateFunc
    sample: bool  # divided by n − 1, not n
    root: bool  # the standard deviation: the square root of the variance
    summed = True
    centred_weights = variance_weights

    def parts(
        self,
        arg: exp.Expression | None,
        clamp: ValueRange | None,
        resolved: Resolved,
        debiased: bool,
        level: float | None,
    ) -> list[Wanted]:
        arg = required(arg, "a variance's argument")
        clamp = required(clamp, "a variance's bounds")
        arg_sql = display(arg)
        centre = centre_of(clamp)
        number = exp.Literal.number(centre if clamp.integral else repr(float(centre)))
        deviation = exp.Sub(this=exp.Paren(this=arg.copy()), expression=exp.Paren(this=number))
        square = exp.Mul(
            this=exp.Paren(this=deviation.copy()), expression=exp.Paren(this=deviation)
        )
        reach = max(centre - clamp.lo, clamp.hi - centre)
        return [
            count_of_values(arg, resolved),
            Wanted(MeasureKind.SUM, deviation,
                   ValueRange(clamp.lo - centre, clamp.hi - centre, clamp.integral),
                   f"SUM({arg_sql} - {centre})", 0),
            Wanted(MeasureKind.SUM, square, ValueRange(0, reach * reach, clamp.integral),
                   f"SUM(({arg_sql} - {centre})^2)", 0),
        ]  # fmt: skip

    def typed(self, names: tuple[str, ...], clamp: ValueRange | None) -> Parts:
        count, centred, squares = names
        return Variance(count, centred, squares, centre_of(required(clamp, "a variance's bounds")))

    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        """The variance (or its square root) from its count and centred sums."""
        variance = narrowed(parts, Variance)
        count, s1, s2 = (noisy(n) for n in variance.names)
        ms = [plan.measurement(n) for n in variance.names]
        widest = literal(max_variance(plan, variance))
        n = at_least(count, 2 if self.sample else 1)
        # Means of the values' distance to the middle of the bounds and of its square:
        # each sum is released centred on its own centre.
        m1 = exp.Paren(this=literal(ms[1].centre_value) + s1 / n)
        m2 = exp.Paren(this=literal(ms[2].centre_value) + s2 / n)
        pop = exp.Paren(this=m2 - m1 * m1.copy())
        if self.sample:
            less_one = exp.Paren(this=n.copy() - 1)
            var = within_sql(pop * n.copy() / less_one, exp.Literal.number(0),
                              widest * n.copy() / less_one.copy())  # fmt: skip
        else:
            var = within_sql(pop, exp.Literal.number(0), widest)
        return exp.Sqrt(this=var) if self.root else var

    def expected(self, plan: Plan, name: str, parts: Parts) -> Expected | None:
        return variance_error, narrowed(parts, Variance), self.root

    def interval(
        self, cells: CellIntervals, name: str, parts: Parts, pid: int, alpha: float
    ) -> Bounds | None:
        return cells.variance(narrowed(parts, Variance), self, pid, alpha)

    def dominance(self, plan: Plan, name: str, parts: Parts) -> Rule:
        """Judged by its range, from 0 to the widest its bounds allow, floored at its
        expected error."""
        variance = narrowed(parts, Variance)
        widest = max_variance(plan, variance)
        high = math.sqrt(widest) if self.root else widest
        floor = self.expected(plan, name, parts)
        return "range", (0.0, high, plan.measurement(variance.count), floor)


def max_variance(plan: Plan, parts: Variance) -> float:
    """The largest population variance of values within the argument's bounds."""
    deviation = plan.measurement(parts.centred).bounds
    return ((deviation.hi - deviation.lo) / 2) ** 2


def centre_of(clamp: ValueRange) -> float:
    """The middle of a variance's bounds, as its SQL subtracts it (a whole number for
    integers, so the differences stay integers)."""
    if clamp.integral:
        return math.floor((clamp.lo + clamp.hi) / 2)
    return (clamp.lo + clamp.hi) / 2


VAR_SAMP = Spread(AggregateFunc.VAR_SAMP, sample=True, root=False)
VAR_POP = Spread(AggregateFunc.VAR_POP, sample=False, root=False)
STDDEV_SAMP = Spread(AggregateFunc.STDDEV_SAMP, sample=True, root=True)
STDDEV_POP = Spread(AggregateFunc.STDDEV_POP, sample=False, root=True)
