"""Value bounds chosen privately: clip a sum's values where the data lies, not where
the policy's declared range ends.

A declared range must hold every value the domain allows: incomes in
``[0, 200000]``. Most values lie far inside it, but a sum's noise is calibrated to
the whole range, so an average over a skewed column is much noisier than it
needs to be. ``%%dpsql --clip SHARE`` (request field ``clip``) answers in two
releases, as Google's differential privacy library's ``ApproxBounds`` does, and a
third where values are moved (below; ``sql/clip_releases.py`` runs them):

1. **Bounds** (``ClipBounds``): with ``SHARE`` of the query's ε, a DP quantile
   (the exponential mechanism of ``dp/quantile_selection.py``, OpenDP's scores) of each
   summed argument at ``LEVELS`` over the query's rows (the same scans, joins,
   ``WHERE`` and contribution bounds, no ``GROUP BY``): ``bounds_checked`` makes
   that query from the checked one.
2. **The query** (``Clipped``), with the rest of the ε, each summed argument's
   interval cut to its noisy bounds (``clip_bounds``): the generated SQL clamps
   each value into them (the stored values lie in the declared range, wider), and
   the sensitivities, centres and intervals follow the narrower interval.

**When the bounds are used** (``clipped``, the rule). The first release also counts
each summed argument's values (a noisy ``COUNT``), so the gate can judge, from
public facts and that count alone, whether the ε it spent chose bounds worth
using. A quantile selection's accuracy is computable from its ε, its candidate
count and the symmetric distance one unit can cause (``QuantileNoise.rank_radius``):
with 95% probability the released candidate lies within ``r`` ranks of the
quantile asked for. The bounds of an argument are used when both its bounds'
``r`` are at most ``USEFUL_RANKS`` (a tenth) of the lower end of its count's 95%
interval: then each bound moves, with 95% confidence, at most the 2% asked for
plus a tenth of the values. Otherwise the bounds are noise more than data (at
ε 0.3 with ``--clip 0.25``, ``r`` is about 780 ranks whatever the data: over the
210 travellers of issue 39 any candidate may come out) and the **declared bounds
are kept** for that argument, which the reply says
(``ClipFact.source`` is ``"declared"``, with the figures the rule read). Bounds
per group are not chosen: the clamp is one expression for all groups.

**What a clipped cell holds.** A cell whose argument was clipped at bounds from
the data is the aggregate of the values moved into them (the clipped quantity), and
its interval holds that quantity (the plan's intervals are computed over the clip,
which every clamped value lies within); the plain aggregate may lie outside it,
by the bias the clip causes. The reply says so per argument
(``ClipFact.holds``), and a third release counts, per group, the values the clip
moved (``ClipMoved``: a noisy ``COUNT`` of the rows outside the clip, with
``MOVED_SHARE`` of the ε left after the bounds, taken from the query's part, so
the three releases together cost the ε asked for).

Privacy. The first release is ``SHARE·ε``-DP. For every fixed clip the query's is
DP at the ε it is given (``(1 − SHARE)·ε``, less ``MOVED_SHARE`` of that where
values are counted): its SQL clamps every value into the clip, so the
sensitivity holds whatever the data. The clip is a function of the first release
alone (post-processing: the rule reads the first release and the plan), so by
adaptive composition the releases are ε-DP together, each charged as a query of
its own (the ledger shows each). The count of values moved is a function of the
data and the clip, a count with the sensitivity of any count for each fixed clip.
Values outside the clip are moved to its ends: a bias, traded for less noise, which
the reply states (the bounds used, why, and the values moved).

**Rows per person** (``RowsFact``). Where the dataset has a privacy unit, the first
release also chooses how many rows each person brings to each group of the query
(``max_rows_per_partition``, which ``--max-rows`` tightens by hand): a DP quantile
at ``ROWS_LEVEL`` of each person's count of the query's bounded rows (one value a
person, ``sql/unit_rows.py``, so its distance is one value's,
``dp.quantiles.unit_value_distance``), and a noisy count of the persons
(``COUNT(DISTINCT unit)``). The same rule judges it: used when its 95% rank radius
is at most ``USEFUL_RANKS`` of the lower end of the persons' count's 95% interval;
then the query (and the count of values moved) is asked with the tighter bound,
``ROWS_FACTOR`` times the chosen count (at most the policy's). The level is not
near 1 because the exponential mechanism cannot find a quantile there: every
count above the largest scores alike, so one of them comes out almost at random;
the factor keeps the rows of the persons past the quantile instead. A person's
rows beyond the bound are left out (a bias, which the reply states with the
figures); the noise of every count and sum shrinks with it (TPC-H's q5 at SF 1:
64 rows a person to 4, ``docs/speed.md``). Privacy:
the bound is a function of the first release alone, and for every fixed bound the
query's SQL enforces it (the window ranks each person's rows), so the argument
above holds unchanged. A query that sums nothing may still be clipped for its rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlglot import exp

from dpmagic.gate.dp.levels import REPORT_ALPHA
from dpmagic.gate.failures import Refused, required
from dpmagic.gate.sql import unit_rows
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.bound import Bounded, bound
from dpmagic.gate.sql.check import AggregateCall, Checked, Output
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.plan_types import Plan, Selection
from dpmagic.gate.sql.value_range import ValueRange

# The quantiles the bounds are chosen at: a fiftieth of the values is moved to each end.
LEVELS = (0.02, 0.98)
PREFIX = "__clip"
# The rule: bounds chosen from the data are used when each one's 95% rank radius is at
# most this share of the (least plausible) number of values; else the declared ones.
USEFUL_RANKS = 0.1
# The share of the ε left after the bounds that counts the values the clip moved.
MOVED_SHARE = 0.05
DATA, DECLARED = "data", "declared"
# Rows per person: this quantile of the persons' counts of rows, times ``ROWS_FACTOR``.
# A quantile near 1 is chosen almost at random above the data (every count above the
# largest scores alike), so a lower one is chosen, and the bound keeps the rows of the
# persons up to twice as far out.
ROWS_LEVEL = 0.9
ROWS_FACTOR = 2
ROWS_LABEL, PERSONS_LABEL = "rows of each person", "persons"


@dataclass(frozen=True)
class ClipBounds:
    """The first release: the bounds of the query's summed arguments, and a count of
    each one's values (what the rule judges the bounds' rank error against)."""


@dataclass(frozen=True)
class ClipFact:
    """What the gate decided for one summed argument, and the public figures it read:
    sent in the reply (``reply``), never re-derived by the client."""

    aggregate: str  # the first aggregate summing the argument, as written
    source: str  # DATA: the bounds chosen from the data; DECLARED: the policy's kept
    bounds: tuple[float, float]  # the bounds the query's values were moved into
    selected: tuple[float, float]  # what the first release chose (used or not)
    declared: tuple[float, float]
    rank_error: float  # the larger bound's 95% radius in ranks (``rank_radius``)
    values: float  # the noisy count of the argument's values
    values_low: float  # the lower end of its 95% interval, which the rule reads

    @property
    def reason(self) -> str:
        """The rule as it applied, in words (the figures are sent beside it)."""
        share = f"{USEFUL_RANKS:.0%}"
        if self.source == DATA:
            return (
                f"each bound is within {self.rank_error:,.0f} ranks of its quantile (95%), "
                f"at most {share} of the at least {self.values_low:,.0f} values"
            )
        return (
            f"the bounds chosen were each only within {self.rank_error:,.0f} ranks of their "
            f"quantile (95%), more than {share} of the at least "
            f"{max(self.values_low, 0.0):,.0f} values: too little ε to be useful, "
            "so the declared bounds were kept"
        )


@dataclass(frozen=True)
class RowsFact:
    """What the gate decided for the rows each person brings to a group, and the public
    figures it read: sent in the reply, never re-derived by the client."""

    source: str  # DATA: the chosen bound is used; DECLARED: the policy's (or --max-rows) kept
    rows: int  # the bound the query was asked with
    selected: int  # what the first release chose (used or not)
    declared: int
    rank_error: float  # the selection's 95% radius in persons (``rank_radius``)
    persons: float  # the noisy count of persons
    persons_low: float  # the lower end of its 95% interval, which the rule reads

    @property
    def reason(self) -> str:
        """The rule as it applied, in words (the figures are sent beside it)."""
        share = f"{USEFUL_RANKS:.0%}"
        if self.source == DATA:
            return (
                f"{self.selected:,} rows, chosen within {self.rank_error:,.0f} persons of "
                f"the persons' {ROWS_LEVEL:.0%} quantile (95%), at most {share} of the at "
                f"least {self.persons_low:,.0f} persons; each person keeps up to "
                f"{ROWS_FACTOR} times that"
            )
        return (
            f"the count chosen was only within {self.rank_error:,.0f} persons of its "
            f"quantile (95%), more than {share} of the at least "
            f"{max(self.persons_low, 0.0):,.0f} persons: too little ε to be useful, "
            f"so each person's rows stay bounded by {self.declared:,}"
        )


@dataclass(frozen=True)
class MovedCount:
    """The third release's cell for one group and argument: the noisy count of the
    values the clip moved, and its 95% interval."""

    aggregate: str
    group: tuple[object, ...]  # the group's key values (none without GROUP BY)
    count: float
    interval: tuple[float, float] | None


@dataclass(frozen=True)
class Clipped:
    """The query's release: each summed argument (by its canonical SQL) cut to
    ``(lower, upper)``; ``facts`` says, per argument, where those came from, and
    ``moved`` what the third release counted (both for the reply: a stage is part of
    the query's replay key, and the rule and the counts replay alike)."""

    clips: tuple[tuple[str, float, float], ...]
    facts: tuple[ClipFact, ...] = ()
    moved: tuple[MovedCount, ...] = ()
    rows: RowsFact | None = None  # where the dataset has a unit and the rule ran

    def get(self, arg: exp.Expression) -> tuple[float, float] | None:
        text = arg.sql(dialect=DIALECT)
        return next(((lo, hi) for key, lo, hi in self.clips if key == text), None)

    @property
    def row_bound(self) -> int | None:
        """The rows a person brings to a group, where chosen from the data: the query's
        and the moved count's dataset is tightened to it (``request.tightened``)."""
        if self.rows is None or self.rows.source != DATA:
            return None
        return self.rows.rows

    @property
    def moves(self) -> bool:
        """Whether any argument is clipped at bounds from the data (values may move)."""
        return any(f.source == DATA for f in self.facts)


@dataclass(frozen=True)
class ClipMoved:
    """The third release: per group, a noisy count of each clipped argument's values
    outside its clip (``moved_checked``)."""

    clipped: Clipped


ClipStage = ClipBounds | Clipped | ClipMoved


def targets(checked: Checked) -> list[AggregateCall]:
    """The query's summed aggregates, one per distinct argument."""
    seen: dict[str, AggregateCall] = {}
    for agg in checked.aggregates:
        if kind_of(agg.func).summed and agg.arg is not None:
            seen.setdefault(agg.arg.sql(dialect=DIALECT), agg)
    if not seen and not chooses_rows(checked):
        raise Refused(
            "--clip chooses the bounds of the values a query sums (SUM, AVG, VAR, STDDEV) "
            "and the rows each person brings to a group: this query sums none, and its "
            "dataset has no privacy unit or bounds each person to one row a group already"
        )
    return list(seen.values())


def chooses_rows(checked: Checked) -> bool:
    """Whether the first release chooses the rows per person: where the dataset has a
    unit and lets a person bring more than one row to a group, and some private table
    the query reads may hold more than one row of a person (else there is nothing to
    tighten, and the first release's ε stays whole for the values' bounds)."""
    resolved = checked.resolved
    if resolved.unit is None or resolved.dataset.max_rows_per_partition <= 1:
        return False
    return any(s.table.max_rows != 1 for s in resolved.scans if not s.table.public)


def bounds_checked(checked: Checked) -> Checked:
    """The first release's query: for each summed argument its quantiles at ``LEVELS``
    and the count of its values, over the same rows, without groups, ``HAVING``, order
    or limit."""
    aggregates: list[AggregateCall] = []
    outputs: list[Output] = []

    def add(
        func: AggregateFunc, arg: exp.Expression | None, label: str, level: float | None
    ) -> None:
        name = f"{PREFIX}{len(aggregates)}"
        aggregates.append(AggregateCall(name, func, arg, label, level))
        outputs.append(Output(name=name, expr=exp.column(name)))

    for agg in targets(checked):
        for side, level in zip(("lower", "upper"), LEVELS, strict=True):
            add(AggregateFunc.QUANTILE, agg.arg, f"{side} bound of {agg.label}", level)
        add(AggregateFunc.COUNT, agg.arg, f"values of {agg.label}", None)
    return replace(
        checked,
        keys=(),
        outputs=tuple(outputs),
        aggregates=tuple(aggregates),
        having=None,
        order=(),
        limit=None,
        offset=None,
    )


def clipped(
    checked: Checked,
    values: Sequence[float],
    first: Plan | None = None,
    counted: Sequence[tuple[float, float] | None] | None = None,
) -> Clipped:
    """The second release's clips from the first's released row (``bounds_checked``'s
    outputs in order: lower, upper, count, per summed argument); a pair drawn out of
    order is taken as the interval between them.

    With the first release's plan (``first``) the rule applies (the module's
    docstring): an argument whose bounds' 95% rank radius exceeds ``USEFUL_RANKS``
    of the lower end of its count's 95% interval (``counted``, from the first
    reply's intervals; else the count itself) keeps its declared bounds. Without
    it (an engine that passes only the row) the bounds are used as released."""
    clips, facts = [], []
    summed = targets(checked)
    width = 3 if len(values) >= 3 * len(summed) else 2
    for i, agg in enumerate(summed):
        key = required(agg.arg, "a summed argument").sql(dialect=DIALECT)
        a, b = values[width * i], values[width * i + 1]
        selected = (min(a, b), max(a, b))
        if first is None:
            clips.append((key, *selected))
            continue
        lower, upper = (_selection(first, f"{side} bound of {agg.label}")
                        for side in ("lower", "upper"))  # fmt: skip
        radius = max(s.noise.rank_radius(REPORT_ALPHA) for s in (lower, upper))
        count = values[width * i + 2] if width == 3 else 0.0
        low = count
        if counted is not None and counted[i] is not None:
            low = min(count, required(counted[i], "a count's interval")[0])
        useful = low > 0 and radius <= USEFUL_RANKS * low
        declared = (float(lower.grid.lo), float(lower.grid.hi))
        if lower.grid.integral:  # as ``clip_bounds`` applies it: whole numbers
            selected = (float(math.floor(selected[0])), float(math.ceil(selected[1])))
        used = selected if useful else declared
        clips.append((key, *used))
        facts.append(
            ClipFact(
                agg.label,
                DATA if useful else DECLARED,
                used,
                selected,
                declared,
                radius,
                count,
                low,
            )
        )
    rows = None
    if first is not None and any(unit_rows.is_marker(s.arg) for s in first.selections):
        at = width * len(summed)
        counted_persons = None if counted is None or len(counted) <= len(summed) else counted[-1]
        rows = _rows_fact(first, values[at], values[at + 1], counted_persons)
    return Clipped(tuple(clips), tuple(facts), rows=rows)


def _rows_fact(
    first: Plan, chosen: float, persons: float, interval: tuple[float, float] | None
) -> RowsFact:
    """The rule for the rows per person (the module's docstring): the count chosen
    is used when its selection's 95% rank radius is at most ``USEFUL_RANKS`` of the
    lower end of the persons' count's 95% interval."""
    selection = _selection(first, ROWS_LABEL)
    radius = selection.noise.rank_radius(REPORT_ALPHA)
    low = persons if interval is None else min(persons, interval[0])
    declared = first.dataset.max_rows_per_partition
    selected = max(1, min(math.ceil(chosen), declared))
    useful = low > 0 and radius <= USEFUL_RANKS * low
    return RowsFact(
        DATA if useful else DECLARED,
        min(ROWS_FACTOR * selected, declared) if useful else declared,
        selected,
        declared,
        radius,
        persons,
        low,
    )


def _selection(first: Plan, label: str) -> Selection:
    return next(s for s in first.selections if s.label == label)


def with_rows(bounded: Bounded) -> Bounded:
    """The first release's query with the rows per person (``RowsFact``) to choose
    (``chooses_rows``): a quantile of each person's count of the query's bounded rows
    (``sql/unit_rows.py``), among ``1`` to the rows a person brings to a group, and a
    count of those values (the persons); after the summed arguments' bounds and counts."""
    checked = bounded.checked
    if not chooses_rows(checked):
        return bounded
    most = checked.resolved.dataset.max_rows_per_partition
    rows = AggregateCall(
        f"{PREFIX}r", AggregateFunc.QUANTILE, unit_rows.marker(), ROWS_LABEL, ROWS_LEVEL
    )
    persons = AggregateCall(f"{PREFIX}p", AggregateFunc.COUNT, unit_rows.marker(), PERSONS_LABEL)
    added = (rows, persons)
    checked = replace(
        checked,
        aggregates=(*checked.aggregates, *added),
        outputs=(*checked.outputs, *(Output(name=a.name, expr=exp.column(a.name)) for a in added)),
    )
    return replace(
        bounded, checked=checked, bounds={**bounded.bounds, rows.name: unit_rows.candidates(most)}
    )


def moved_checked(bounded: Bounded, stage: ClipMoved) -> Checked:
    """The third release's query: the query's rows and groups, and per argument clipped
    at bounds from the data, the count of its values outside the clip as the second
    release applies it (``clip_bounds``: whole numbers for an integer argument, within
    the declared range), one column per argument after the group keys. Groups whose
    keys are private (released by partition selection) are not listed: the count is
    then of all the query's rows, so that it selects no groups of its own."""
    checked = bounded.checked
    grouped = not any(d.private for d in bounded.domains)
    keys = [Output(name=f"{PREFIX}k{i}", expr=exp.column(k.name))
            for i, k in enumerate(checked.keys if grouped else ())]  # fmt: skip
    aggregates: list[AggregateCall] = []
    outputs: list[Output] = []
    facts = {f.aggregate: f for f in stage.clipped.facts}
    for agg in targets(checked):
        fact = facts.get(agg.label)
        if fact is not None and fact.source != DATA:
            continue
        arg = required(agg.arg, "a summed argument")
        cut = clip_bounds(arg, bounded.bounds[agg.name], stage.clipped)
        outside = exp.or_(
            exp.LT(this=arg.copy(), expression=_number(cut.lo)),
            exp.GT(this=arg.copy(), expression=_number(cut.hi)),
        )
        case = exp.Case(ifs=[exp.If(this=outside, true=exp.Literal.number(1))])
        name = f"{PREFIX}{len(aggregates)}"
        aggregates.append(
            AggregateCall(name, AggregateFunc.COUNT, case, f"values of {agg.label} moved")
        )
        outputs.append(Output(name=name, expr=exp.column(name)))
    return replace(
        checked,
        keys=checked.keys if grouped else (),
        outputs=(*keys, *outputs),
        aggregates=tuple(aggregates),
        having=None,
        order=(),
        limit=None,
        offset=None,
    )


def _number(value: float) -> exp.Expression:
    text = str(int(value)) if float(value).is_integer() else repr(float(value))
    return exp.Literal.number(text)


def clip_bounded(bounded: Bounded, stage: ClipStage | None) -> Bounded:
    """The bound pass's intervals with each summed argument's cut to its clip: the pass
    between ``bound`` and ``plan`` of a clipped query (the identity otherwise). For the
    first release, its query with the rows per person to choose (``with_rows``); for the
    third, the bound pass of its own query (``moved_checked``)."""
    if isinstance(stage, ClipMoved):
        return bound(moved_checked(bounded, stage))
    if isinstance(stage, ClipBounds):
        return with_rows(bounded)
    if not isinstance(stage, Clipped):
        return bounded
    checked = bounded.checked
    cut = {
        name: clip_bounds(required(checked.aggregate(name).arg, "a summed argument"), iv, stage)
        for name, iv in bounded.bounds.items()
    }
    return replace(bounded, bounds=cut)


def clip_bounds(arg: exp.Expression, interval: ValueRange, stage: ClipStage | None) -> ValueRange:
    """``interval`` cut to the clip chosen for ``arg``, if any; an integer argument's
    clip widened to whole numbers."""
    if not isinstance(stage, Clipped):
        return interval
    clip = stage.get(arg)
    if clip is None:
        return interval
    lo, hi = clip
    if interval.integral:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(interval.lo, lo), min(interval.hi, hi)
    if lo > hi:  # a clip outside the declared range: its nearest end
        lo = hi = min(max(clip[0], interval.lo), interval.hi)
    return ValueRange(lo, hi, interval.integral)
