"""``TRIMMED_MEAN(x, p)``: in each group, the mean of the values of ``x`` left after
dropping the ``m = ⌊p·n⌋`` smallest and the ``m`` largest of its ``n`` non-NULL ones
(``0 ≤ p < ½``, a literal), as scipy's ``trim_mean`` computes it: a mean that a few
values far out cannot move. The values are first clamped into their declared bounds
``[lo, hi]``, as every kind's are.

Mechanism: a noisy *trimmed sum* and a noisy count. The engine sums the kept values
less the middle of the bounds ``c`` (``rewrite``: each value ranked in its group by a
window, ``Measurement.trim``), ``S = Σ_{i=m+1}^{n−m} (x₍ᵢ₎ − c)``, exactly, on the sum's grid;
the count is its argument's. Released: ``c + S̃ / max(Ñ − 2⌊p·Ñ⌋, 1)`` within
``[lo, hi]``, post-processing of the two.

**The trimmed sum's sensitivity is a plain sum's** of values in ``[a, b] = [lo − c,
hi − c]`` (``a ≤ 0 ≤ b``), so the plan calibrates it by ``dp.sums``' rule unchanged.
Proof. Let ``G(t) = x₍⌈t⌉₎`` for ``t ∈ (0, n]`` (the sorted values as a step
function), ``G = a`` for ``t ≤ 0`` and ``G = b`` for ``t > n``; then
``S = ∫_m^{n−m} G``. Add one value in ``[a, b]``: the new step function ``G'``
satisfies ``G(t − 1) ≤ G'(t) ≤ G(t)`` for every ``t`` (the i-th smallest of the
``n + 1`` lies between the (i−1)-th and the i-th of the ``n``; at the ends by the
extension), and ``m' = m + δ`` with ``δ ∈ {0, 1}`` (``p < 1``). So
``S' = ∫_{m+δ}^{n+1−m−δ} G' ≤ ∫_{m+δ}^{n+1−m−δ} G = S − ∫_m^{m+δ} G + ∫_{n−m}^{n+1−m−δ} G
≤ S − δa + (1 − δ)b ≤ S + max(|a|, |b|)``, and likewise, from ``G'(t) ≥ G(t − 1)``,
``S' ≥ S + ∫_{m+δ−1}^{m} G − ∫_{n−m−δ}^{n−m} G ≥ S + (1 − δ)a − δb ≥ S − max(|a|, |b|)``.
Removing a value is the same step backwards. Replacing one value ``y`` by ``y'`` keeps
``n`` and ``m``, and moves every order statistic the same way and their total by
``|y − y'|``, so ``S`` by at most ``|y − y'| ≤ b − a``. A unit's rows in a group are
added, removed or replaced one at a time, so each cell moves by at most what a plain
sum of values in ``[a, b]`` moves (``dp.sums``' ``reach`` and ``width``), and the cells
add up as there. Rounding a float to the sum's grid keeps the values' order.
``tests/unit/test_aggregate_catalogue.py`` checks the bound on every neighbour of a
table, and exhaustively on small multisets.

Interval: the sum's and the count's own intervals at ``alpha/2`` each (a union
bound), through ``S/D`` for every ``D = n − 2⌊p·n⌋`` the count allows
(``(1 − 2p)·n ≤ D < (1 − 2p)·n + 2``), widened by half a grid step for floats, and cut
to the bounds. The dry run's error per group size, and the noise-dominance floor, are
its linearised error, as an average's (``expected.average_error``) with the sum's
noise over ``1 − 2p``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.failures import Refused, required
from dpmagic.gate.sql.aggregates.base import Measuring, count_of_values
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.noisy_sql import at_least, literal, noisy, within_sql
from dpmagic.gate.sql.aggregates.parts import Parts, Trimmed, Wanted, narrowed
from dpmagic.gate.sql.aggregates.variance import centre_of
from dpmagic.gate.sql.expected import gaussian, mix_quantile
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.trees import display
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.sql.dominance import Expected, Rule
    from dpmagic.gate.sql.intervals import Bounds, CellIntervals
    from dpmagic.gate.sql.plan_types import Plan
    from dpmagic.gate.sql.resolve import Resolved


class TrimmedMean(Measuring):
    func = AggregateFunc.TRIMMED_MEAN

    def level(self, node: exp.Expression) -> float:
        """The fraction trimmed at each end: a number literal at least 0 and below ½."""
        label = display(node)
        p = node.expressions[1] if len(node.expressions) == 2 else None
        if not (isinstance(p, exp.Literal) and not p.is_string and 0 <= float(p.this) < 0.5):
            raise Refused(
                f"{label}: TRIMMED_MEAN(x, p) takes a value and the fraction p cut at each "
                "end, one number at least 0 and below 0.5"
            )
        return float(p.this)

    def parts(
        self,
        arg: exp.Expression | None,
        clamp: ValueRange | None,
        resolved: Resolved,
        debiased: bool,
        level: float | None,
    ) -> list[Wanted]:
        arg = required(arg, "a trimmed mean's argument")
        clamp = required(clamp, "a trimmed mean's bounds")
        p = required(level, "a trimmed mean's fraction")
        centre = centre_of(clamp)
        number = exp.Literal.number(centre if clamp.integral else repr(float(centre)))
        deviation = exp.Sub(this=exp.Paren(this=arg.copy()), expression=exp.Paren(this=number))
        within = ValueRange(clamp.lo - centre, clamp.hi - centre, clamp.integral)
        label = f"SUM({display(arg)} - {centre}) trimmed by {p:g} at each end"
        total = Wanted(MeasureKind.SUM, deviation, within, label, trim=p)
        return [total, count_of_values(arg, resolved)]

    def typed(self, names: tuple[str, ...], clamp: ValueRange | None) -> Parts:
        total, count = names
        return Trimmed(total, count, centre_of(required(clamp, "a trimmed mean's bounds")))

    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        """The centre plus the trimmed sum over the kept values' number, in the bounds."""
        trimmed = narrowed(parts, Trimmed)
        total = plan.measurement(trimmed.total)
        n = noisy(trimmed.count)
        cut = exp.Floor(this=exp.Mul(this=literal(total.trim), expression=n.copy()))
        kept = at_least(exp.Sub(this=n, expression=exp.Mul(this=exp.Literal.number(2),
                                                           expression=cut)), 1)  # fmt: skip
        mean = literal(trimmed.centre) + noisy(trimmed.total) / kept
        lo, hi = _bounds(plan, trimmed)
        return within_sql(mean, literal(lo), literal(hi))

    def expected(self, plan: Plan, name: str, parts: Parts) -> Expected | None:
        return trimmed_error, narrowed(parts, Trimmed), False

    def interval(
        self, cells: CellIntervals, name: str, parts: Parts, pid: int, alpha: float
    ) -> Bounds | None:
        trimmed = narrowed(parts, Trimmed)
        plan = cells.plan
        total, count = plan.measurement(trimmed.total), plan.measurement(trimmed.count)
        lo, hi = _bounds(plan, trimmed)
        s_lo, s_hi = cells.measured(total, pid, alpha / 2)
        n_lo, n_hi = cells.measured(count, pid, alpha / 2)
        if not n_lo >= 1:  # the group may hold no value: nothing is known
            return lo, hi
        keep = 1 - 2 * total.trim
        d_lo, d_hi = max(keep * n_lo, 1.0), keep * n_hi + 2
        ends = [s / d for s in (s_lo, s_hi) for d in (d_lo, d_hi)]
        step = 0.0 if total.bounds.integral else 2.0**total.grid_exp / 2
        low = trimmed.centre + min(ends) - step
        high = trimmed.centre + max(ends) + step
        return min(max(low, lo), hi), min(max(high, lo), hi)

    def dominance(self, plan: Plan, name: str, parts: Parts) -> Rule:
        """Judged by its range, floored at its expected error, as an average is."""
        trimmed = narrowed(parts, Trimmed)
        lo, hi = _bounds(plan, trimmed)
        floor = self.expected(plan, name, parts)
        return "range", (lo, hi, plan.measurement(trimmed.count), floor)


def _bounds(plan: Plan, parts: Trimmed) -> tuple[float, float]:
    """The declared bounds the values were clamped into."""
    within = plan.measurement(parts.total).bounds
    return within.lo + parts.centre, within.hi + parts.centre


def trimmed_error(plan: Plan, parts: Trimmed, alpha: float) -> float:
    """``n`` times a trimmed mean's linearised error ``(e_S/(1 − 2p) − t·e_N)/n`` at
    its quantile (``D ≈ (1 − 2p)·n``), with ``t`` at the bound farthest from the
    centre: an average's (``expected.average_error``), its sum's noise over the share
    of values kept."""
    total, count = plan.measurement(parts.total), plan.measurement(parts.count)
    far = max(abs(total.bounds.lo), abs(total.bounds.hi))
    keep = 1 - 2 * total.trim
    return mix_quantile([total.scale / keep, far * count.scale], gaussian(count), alpha)


TRIMMED_MEAN = TrimmedMean()
