"""The interface every kind of the catalogue implements, and what its modules share.

A kind is read from SQL by the check pass (``star``, ``distinct``, ``level``,
``argument``), bounded
by the bound pass (``bounded``), its values' bounds chosen by ``--clip`` where it sums
them (``summed``), and planned by the plan pass: a *measuring* kind into noisy counts
and sums (``Measuring.parts``), named by role once planned (``Measuring.typed``), each
part's share of the budget weighted as ``dp.shares`` decides (``Measuring.weights``); a
*selecting* kind (a quantile) into an exponential-mechanism selection per partition,
which ``plan.py`` makes from its level. Every privacy number is a rule of ``dp/``.

After the plan, each pass asks the kind what differs between kinds: its released
value (``released``, for ``post_query``), its cell's interval (``interval``, for
``intervals``), its noise-dominance rule (``dominance``), its error per group size
(``expected``, for the dry run's ``summary`` and for ``dominance``) and its debiasing
over a randomized-response column (``debiasing``, ``debias``, for ``randomized``).
A kind imports no pass at run time: the check pass imports the kinds through the
registry, and most passes import the check pass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from sqlglot import exp

from dpmagic.gate.sql.aggregates.debiasing import Debias, Debiased, Debiasing, Values
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.parts import Measured, Parts, Wanted, narrowed
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.trees import display
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.dp.contribution import Contribution
    from dpmagic.gate.policy import Neighbouring
    from dpmagic.gate.sql.dominance import Expected, Rule
    from dpmagic.gate.sql.intervals import Bounds, CellIntervals
    from dpmagic.gate.sql.plan_types import Plan
    from dpmagic.gate.sql.resolve import Resolved


class Aggregate(ABC):
    """One kind of aggregate, as every pass before the noise sees it."""

    func: AggregateFunc
    star: bool = False  # whether ``f(*)`` is allowed (``COUNT(*)``)
    distinct: Kind | None = None  # the kind ``f(DISTINCT x)`` is, where allowed
    bounded: bool = True  # whether its argument needs declared bounds (all but counts)
    summed: bool = False  # whether it adds up its clamped values (``--clip`` bounds them)
    # How it is debiased over a randomized-response column (``randomized``); None:
    # refused there.
    debiasing: Debiasing | None = None
    # Whether each cell is one noisy count or sum: its interval is the measurement's,
    # and an accuracy can be promised for it before the query runs.
    single: bool = False

    def level(self, node: exp.Expression) -> float | None:
        """The number ``node`` names beside its argument (a quantile's level, a trimmed
        mean's fraction); None for a kind that has none."""
        return None

    def argument(self, arg: exp.Expression) -> exp.Expression:
        """The row expression aggregated, from the call's argument ``arg``: itself,
        unless the kind reads it otherwise."""
        return arg

    @abstractmethod
    def released(self, plan: Plan, parts: Parts) -> exp.Expression:
        """Its released value over the noisy table's columns (``noisy_sql``), from its
        ``parts`` as ``plan`` measured them: post-processing of noisy values only."""

    def released_debiased(self, column: exp.Column) -> exp.Expression:
        """Its released value from ``column``, its debiased estimate (``randomized``),
        already clipped where the estimate has bounds."""
        return column

    def debias(
        self, d: Debias, first: Values, second: Values | None, groups: list[list[int]]
    ) -> Debiased:
        """Its estimates with the randomization undone (``aggregates.debiasing``), from
        its noisy measurements ``first`` and ``second``; ``groups``, for a count, the
        partitions that differ only in the randomized key. A ValueError (the gate's own
        bug) for a kind that is never debiased (``debiasing`` None)."""
        raise ValueError(f"{self.func} is never debiased")

    def expected(self, plan: Plan, name: str, parts: Parts) -> Expected | None:
        """Its error in a group of ``n`` rows, ``n`` times over, as ``expected``'s
        ``error(plan, parts, alpha)``, with the parts it reads and whether the kind
        releases its square root: the dry run states it per group size, and noise
        dominance floors its interval at it. None for a kind whose error is not one of
        its group's size (a count's or sum's is its measurement's, in ``dominance``'s
        rule) or is known only after it runs (a quantile's, from its percentiles)."""
        return None

    @abstractmethod
    def interval(
        self, cells: CellIntervals, name: str, parts: Parts, pid: int, alpha: float
    ) -> Bounds | None:
        """The ``1 − alpha`` interval of its cell in partition ``pid``, from the noisy
        values (``cells``, which does the interval arithmetic), or None where none is
        known at that level."""

    @abstractmethod
    def dominance(self, plan: Plan, name: str, parts: Parts) -> Rule:
        """The rule its bare cells are judged by for noise dominance (``dominance``):
        ``name`` is its aggregate in ``plan``, made of ``parts``."""


class Measuring(Aggregate):
    """A kind post-processed from noisy counts and sums of its argument."""

    @abstractmethod
    def parts(
        self,
        arg: exp.Expression | None,
        clamp: ValueRange | None,
        resolved: Resolved,
        debiased: bool,
        level: float | None,
    ) -> list[Wanted]:
        """The noisy counts and sums it is made of, in ``typed``'s order. ``debiased``:
        its argument is a randomized-response column, which debiasing reads raw;
        ``level``: the number its call names (``level``), for a kind that has one."""

    @abstractmethod
    def typed(self, names: tuple[str, ...], clamp: ValueRange | None) -> Parts:
        """Its parts, planned as the measurements ``names`` (``parts``' order), by role."""

    # How its centred parts share the query's budget, by their part in its error
    # (a ``dp.shares`` rule); None: evenly.
    centred_weights: ClassVar[
        Callable[[Contribution, Neighbouring, bool], tuple[float, ...]] | None
    ] = None

    def weights(
        self,
        parts: int,
        centred: bool,
        c: Contribution,
        neighbouring: Neighbouring,
        gaussian: bool,
    ) -> tuple[float, ...]:
        """Each part's weight in the split of the query's budget (``dp.shares``): an
        even share each, unless the kind weighs its centred parts by their error."""
        rule = type(self).centred_weights
        if centred and rule is not None:
            return rule(c, neighbouring, gaussian)
        return (1.0,) * parts


class SingleMeasured(Measuring):
    """A kind whose cell is one noisy count or sum (``single``): its interval is that
    measurement's, and its bare cells are judged by the zero rule."""

    single = True

    def interval(
        self, cells: CellIntervals, name: str, parts: Parts, pid: int, alpha: float
    ) -> Bounds | None:
        return measured_interval(cells, parts, pid, alpha)

    def dominance(self, plan: Plan, name: str, parts: Parts) -> Rule:
        return measured_rule(plan, name, parts)


class Selecting(Aggregate):
    """A kind released by selection: a quantile at a level, chosen per partition."""

    @abstractmethod
    def level(self, node: exp.Expression) -> float:
        """The level the call asks for, between 0 and 1."""


Kind = Measuring | Selecting


def measured_rule(plan: Plan, name: str, parts: Parts) -> Rule:
    """The zero rule of a bare count or sum, with its measurement and the sign its
    values can take; of a debiased one, the zero rule alone."""
    if name in plan.debiased:
        return "zero", None
    m = plan.measurement(narrowed(parts, Measured).name)
    sign = 1 if m.clamp is None or m.clamp.lo >= 0 else -1 if m.clamp.hi <= 0 else 0
    return "zero", (m, sign)


def measured_interval(cells: CellIntervals, parts: Parts, pid: int, alpha: float) -> Bounds:
    """The interval of a bare count's or sum's cell: its measurement's."""
    return cells.measured(cells.plan.measurement(narrowed(parts, Measured).name), pid, alpha)


def count_of(arg: exp.Expression | None) -> Wanted:
    """A ``COUNT`` of ``arg`` (of rows, for None): how many values a kind's sums add."""
    return Wanted(MeasureKind.COUNT, arg, None, f"COUNT({'*' if arg is None else display(arg)})")


def count_of_values(arg: exp.Expression, resolved: Resolved) -> Wanted:
    """The count of the rows a sum of ``arg`` adds: ``COUNT(*)``, measured once with the
    query's own, where ``arg`` is NULL on no row."""
    return count_of(None) if never_null(arg, resolved) else count_of(arg)


def never_null(arg: exp.Expression, resolved: Resolved) -> bool:
    """Whether ``arg`` is NULL on no row: a column the owner declared ``not_null`` (checked
    at load), read from a scan no LEFT JOIN may leave empty."""
    while isinstance(arg, exp.Paren):
        arg = arg.this
    col = resolved.column(arg)
    scan = resolved.scan(arg.table) if isinstance(arg, exp.Column) else None
    return col is not None and col.not_null and scan is not None and scan.kind != "left"


def sum_of(arg: exp.Expression, clamp: ValueRange) -> Wanted:
    """A plain sum of ``arg`` clamped into ``clamp``."""
    return Wanted(MeasureKind.SUM, arg, clamp, f"SUM({display(arg)})")
