"""Pass 5: the DP plan — partitions, measurements, sensitivities, cost.

Each DP aggregate becomes one or more *measurements*, as its kind in the
catalogue (``aggregates/``) plans it: a count, a count of
distinct values, or a sum of a clamped value on an integer grid (AVG is a
sum and a count; a variance a count, a sum and a sum of squares, all
post-processed; their sums are *centred*, see :class:`Centre`). A
measurement is one vector over all released partitions, noised once; its
sensitivity follows from the contribution bounds (see ``sensitivity``).
Quantiles (MIN, MAX, MEDIAN, percentiles) are *selections*: an exponential
mechanism per partition (see ``selection``), with two more selections for
its interval in the column's units (``edges``) and a count of its argument
(added when the query has none) to judge it by. The query's budget is split
over measurements and selections, evenly but for the parts of an AVG or a
variance, a quantile's edges and added count (``EDGE_WEIGHT``,
``QUANTILE_COUNT_WEIGHT``), which get shares weighted by their part in its error
(``dp.shares``); or, when an accuracy is
asked for, each measurement gets the least cost that delivers it
(``calibration``). Nothing in this pass looks at data: the cost is a
function of the query and the policy, and so is every share.

The values this pass makes are ``plan_types``'. Every privacy number in them is
decided by a rule of ``dp/`` that this pass calls: sensitivities and noises
(``sums``, ``counts``, ``calibration``), what a count of distinct units counts per unit
(``counts.distinct_units``), the partition count assumed for keys chosen from the data
(``partition_selection.chosen_key_partitions``), what each bounding lets a unit
contribute (``enforcement``, through ``ranks``), shares (``shares``), what the parts cost
together (``composition``) and the bounding report's noises and share (``left_out``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import assert_never

from sqlglot import exp

from dpmagic.gate.dp import centred_sums
from dpmagic.gate.dp.accounting import Accountant, Cost
from dpmagic.gate.dp.calibration import Accuracy, Target, count_noise_for, noise_for, spent
from dpmagic.gate.dp.composition import composes, pure_cost
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.counts import distinct_units
from dpmagic.gate.dp.left_out import (
    MAX_REPORT_SHARE,
    LeftOut,
    left_out,
    report_cost,
    report_weight,
)
from dpmagic.gate.dp.partition_selection import (
    KeySelection,
    calibrate_selection,
    chosen_key_partitions,
    key_reach,
)
from dpmagic.gate.dp.quantile_selection import calibrate_quantile, grid
from dpmagic.gate.dp.quantiles import selection_distance, unit_value_distance
from dpmagic.gate.dp.shares import (
    EDGE_WEIGHT,
    measurement_weight,
    part_share,
    total_weight,
)
from dpmagic.gate.dp.sums import sum_sensitivity
from dpmagic.gate.engines.interface import MAX_PARTITIONS
from dpmagic.gate.engines.ranking import load_cap
from dpmagic.gate.failures import Refused, required
from dpmagic.gate.policy import AccountantKind, Dataset
from dpmagic.gate.sql import unit_rows
from dpmagic.gate.sql.aggregates.base import Measuring, Selecting, count_of
from dpmagic.gate.sql.aggregates.parts import Measured, Parts, Wanted
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.bound import Bounded
from dpmagic.gate.sql.check import AggregateCall, Checked, GroupKey
from dpmagic.gate.sql.keys import KeyDomain
from dpmagic.gate.sql.kinds import MeasureKind, Summand
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.plan_types import (
    Centre,
    Edges,
    Measurement,
    Plan,
    Selection,
    grid_bounds,
    partition_rows,
)
from dpmagic.gate.sql.randomized import Debias, debiasing
from dpmagic.gate.sql.ranks import Bounding, Window, bounding, join_cap
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.value_range import ValueRange
from dpmagic.gate.sql.work import Work, unit_work, within

MAX_SCORES = 2_000_000  # candidates scored over all partitions of one quantile
SUM_LIMIT = 2**126
# Summed floats are rounded to a grid this many binary digits finer than the
# noise scale, so rounding is negligible beside the noise.
GRID_BITS_BELOW_SCALE = 24
_I64_MAX = 2**63 - 1
Key = tuple[str, str]


def plan(
    bounded: Bounded,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    accuracy: Accuracy | None = None,
    report: float | None = None,
    quantile_intervals: bool = True,
) -> Plan:
    """With ``accuracy``, ``epsilon`` is ignored: the cost is the least that gives it.
    ``report``: the share of the query's budget for the bounding report (``LeftOut``).
    ``quantile_intervals``: give each quantile its interval in units and a count to
    judge it by (``edges``); a clip's bounds, which only feed the query, need neither."""
    checked = bounded.checked
    resolved = checked.resolved
    dataset = resolved.dataset
    debiased = debiasing(checked)
    if accuracy is not None:
        _accuracy_applies(checked, debiased)
    if report is not None:
        _report_allowed(report, dataset, accuracy)
    asked = None if accuracy is not None else accountant.query_cost(epsilon, delta)
    private = next((d.private for d in bounded.domains if d.private), None)
    if private is not None:
        _private_keys_allowed(private, accountant, delta, accuracy, debiased)
    partitions = () if private else _partitions(checked.keys, bounded.domains)
    # With keys chosen from the data, ``dp/partition_selection`` decides the partition
    # count the sensitivities assume (one at which no two units' reach overlaps).
    reach = chosen_key_partitions(dataset.max_partitions) if private else len(partitions)

    wanted, counted, quantiles, uses = _wanted(bounded, debiased, quantile_intervals)
    kinds = {kind for kind, *_ in wanted.values()}
    keys = [k.expr for k in checked.keys]
    bounds = bounding(dataset, resolved, keys, reach, kinds, private is not None)
    contribution = bounds.contribution(reach)
    work = _work(bounded, bounds, wanted, quantiles)
    rows = partition_rows(resolved, contribution)
    weights = _weights(checked, uses, wanted, contribution, dataset, accountant)
    total = total_weight(weights.values(), len(quantiles), quantile_intervals, bool(private))
    reported = 0.0 if report is None else report_weight(total, report)
    total += reported
    share = None if asked is None else part_share(accountant, asked, total, 1.0)
    target = Target(accountant, share=share, accuracy=accuracy)
    names = {key: f"m{i}" for i, key in enumerate(wanted)}
    measurements = tuple(
        _measurement(
            names[key],
            wanted[key],
            _target(target, asked, total, weights[key]),
            contribution,
            rows,
            dataset,
            names.get(counted.get(key, ("", ""))),
            _summand(wanted[key], resolved),
        )
        for key in wanted
    )
    if asked is None:
        asked = accountant.total((m.cost for m in measurements), delta)
    cost = accountant.group(asked, dataset.group_size) if dataset.group_size > 1 else asked
    for i, key in enumerate(quantiles):
        names[("quantile", f"{key[0]}|{key[1]}")] = f"q{i}"
    distance = selection_distance(contribution, dataset.neighbouring)
    edge = _target(target, asked, total, EDGE_WEIGHT)
    selections = tuple(
        _selection(
            f"q{i}", level, arg, clamp, label, target,
            unit_value_distance(dataset.neighbouring) if unit_rows.is_marker(arg) else distance,
            len(partitions) or 1,
            Edges(names[_key(count_of(arg))], edge.pure_epsilon() if edge.share else 0.0)
            if quantile_intervals else None,
        )
        for i, ((level, _), (arg, clamp, label)) in enumerate(quantiles.items())
    )  # fmt: skip
    key_selection = None
    if private is not None:
        share = required(share, "the ε share of partition selection")
        key_selection = _key_selection(contribution, dataset, share)
    report_noises = None
    if report is not None:
        whole = report_cost(accountant, required(asked, "the asked budget"), total, reported)
        half = _target(target, asked, total, reported / 2)
        report_noises = left_out(report, load_cap(dataset), dataset.neighbouring, half, whole)
    spent_parts = parts_spent(measurements, selections, key_selection, report_noises)
    composes(accountant, asked, spent_parts)
    return Plan(
        checked=checked,
        dataset=dataset,
        keys=checked.keys,
        domains=bounded.domains,
        partitions=partitions,
        bounding=bounds,
        contribution=contribution,
        work=work,
        measurements=measurements,
        selections=selections,
        parts={
            agg.name: _typed_parts(agg, tuple(names[k] for k in uses[agg.name]), bounded)
            for agg in checked.aggregates
        },
        epsilon=cost.epsilon,
        cost=cost,
        unit_cost=asked,
        accuracy=accuracy,
        key_selection=key_selection,
        debiased=debiased,
        left_out=report_noises,
    )


def _work(bounded: Bounded, bounds: Bounding, wanted: dict, quantiles: dict) -> Work:
    """What one unit can add to the query's work, refused (free) above the policy's
    ``max_unit_work`` (``work.py``): decided before the debit, from the plan alone."""
    resolved = bounded.checked.resolved
    dataset = resolved.dataset
    trees = [k.expr for k in bounded.checked.keys]
    trees += [arg for _, arg, *_ in wanted.values() if arg is not None]
    trees += [arg for arg, *_ in quantiles.values()]
    if resolved.unit is not None:
        trees.append(resolved.unit)
    cap = join_cap(bounds)
    sorts = sum(1 for w in wanted.values() if w.trim)  # each trimmed sum ranks its values

    def priced(keyed: bool) -> Work:
        found = unit_work(resolved, cap, load_cap(dataset), trees, len(quantiles),
                          isinstance(bounds, Window), keyed, sorts)  # fmt: skip
        within(found, dataset.max_unit_work, dataset.max_row_work, dataset.privacy_unit)
        return found

    # Keyed scans keep more of a unit's rows (``sql/keyed.py``), but a join the engine
    # orders otherwise may hold more of them: where that is above the policy's limit,
    # the product rule's bound, which keeps fewer, may not be.
    try:
        return priced(True)
    except Refused:
        return priced(False)


def parts_spent(
    measurements: Sequence[Measurement],
    selections: Sequence[Selection],
    key_selection: KeySelection | None,
    left_out: LeftOut | None,
) -> list[Cost]:
    """What each noisy part of a plan costs one unit: its measurements, its quantiles
    and their interval's ends (pure ε, ``composition.pure_cost``), its partition
    selection and its bounding report."""
    costs = [m.cost for m in measurements]
    for s in selections:
        epsilons = [s.epsilon] + ([s.edges.epsilon] * 2 if s.edges else [])
        costs += [pure_cost(e) for e in epsilons]
    if key_selection is not None:
        costs.append(Cost(key_selection.epsilon, key_selection.delta))
    if left_out is not None:
        costs.append(left_out.cost)
    return costs


def _report_allowed(report: float, dataset: Dataset, accuracy: Accuracy | None) -> None:
    if not 0 < report <= MAX_REPORT_SHARE:
        raise Refused(
            f"the bounding report's share of the budget must be above 0 and at most "
            f"{MAX_REPORT_SHARE}"
        )
    if dataset.privacy_unit is None:
        raise Refused(
            "this dataset has no privacy unit: each row is its own unit, and no bound "
            "leaves a row out, so there is nothing to report"
        )
    if accuracy is not None:
        raise Refused("ask for the bounding report with an ε, not with an accuracy")


Quantiles = dict[tuple[float, str], tuple[exp.Expression, ValueRange, str]]


def _wanted(
    bounded: Bounded, debiased: dict[str, Debias], counts: bool = True
) -> tuple[dict[Key, Wanted], dict[Key, Key], Quantiles, dict[str, tuple[Key, ...]]]:
    """What the aggregates are measured by, each measurement once however many
    aggregates read it: the measurements, each centred sum's count, the quantiles,
    and per aggregate the keys of what it is made of; with ``counts``, a ``COUNT``
    of each quantile's argument."""
    checked = bounded.checked
    wanted: dict[Key, Wanted] = {}
    counted: dict[Key, Key] = {}  # a centred sum -> the count of the rows it adds up
    quantiles: Quantiles = {}
    uses: dict[str, tuple[Key, ...]] = {}
    for agg in checked.aggregates:
        match kind_of(agg.func):
            case Selecting():
                arg = required(agg.arg, "a quantile's argument")
                level = required(agg.level, "a quantile's level")
                at = (level, arg.sql(dialect=DIALECT))
                quantiles.setdefault(at, (arg, bounded.bounds[agg.name], agg.label))
                uses[agg.name] = (("quantile", f"{at[0]}|{at[1]}"),)
            case Measuring() as kind:
                clamp = bounded.bounds.get(agg.name)
                parts = kind.parts(
                    agg.arg, clamp, checked.resolved, agg.name in debiased, agg.level
                )
                keys = tuple(_want(wanted, part) for part in parts)
                for key, part in zip(keys, parts, strict=True):
                    if part.counted is not None:
                        counted[key] = keys[part.counted]
                uses[agg.name] = keys
            case unknown:
                assert_never(unknown)
    for arg, _, _ in quantiles.values() if counts else ():
        _want(wanted, count_of(arg))
    return wanted, counted, quantiles, uses


def _private_keys_allowed(
    reason: str,
    accountant: Accountant,
    delta: float,
    accuracy: Accuracy | None,
    debiased: dict[str, Debias],
) -> None:
    """Keys read from the data are released only by DP partition selection, whose
    (ε, δ) the approx accountant can charge; say what would make the query possible."""
    if accountant.name == AccountantKind.PURE:
        raise Refused(
            f"{reason} (keys found in the data are released only by DP partition "
            "selection, which needs δ > 0: this dataset's accountant is pure)"
        )
    if accountant.gaussian:
        raise Refused(
            f"{reason} (DP partition selection needs the approx accountant: its δ cannot "
            "be charged to this dataset's zCDP budget)"
        )
    if accuracy is not None:
        raise Refused(f"{reason}: with keys chosen from the data, ask with ε and δ, not accuracy")
    if not delta > 0:
        raise Refused(
            f"{reason}; or ask with a δ > 0 (for example -d 1e-6) to release the keys found "
            "in the data by DP partition selection"
        )
    if any(d.key is not None for d in debiased.values()):
        # Debiasing a count needs every value of the column in each group.
        raise Refused(
            f"{reason}: a randomized-response column can only be grouped with public keys"
        )


def _key_selection(c: Contribution, dataset: Dataset, share: Cost) -> KeySelection:
    """A unit counts once in each of the ``c.groups`` keys it may reach; replaced by
    another unit, it leaves its keys and the other reaches as many new ones."""
    l0, linf = key_reach(c, dataset.neighbouring)
    return calibrate_selection(l0, linf, share.epsilon, share.delta)


def _accuracy_applies(checked: Checked, debiased: dict[str, Debias]) -> None:
    """An accuracy can be promised, before seeing data, only for cells that are one
    noisy count or sum: an average's interval depends on its noisy count, and a
    debiased one's on the randomization too."""
    if debiased:
        raise Refused(
            "--accuracy cannot be promised over a randomized-response column: its error "
            "depends on the answers; ask with an epsilon instead"
        )
    aggregates = {a.name: a for a in checked.aggregates}
    other = next((a for a in checked.aggregates if not kind_of(a.func).single), None)
    if other is not None:
        raise Refused(
            f"--accuracy applies to COUNT and SUM; {other.label} is not one: "
            "ask with an epsilon instead"
        )
    keys = {k.name for k in checked.keys}
    for out in checked.outputs:
        name = out.expr.name if isinstance(out.expr, exp.Column) else None
        if name in keys:
            continue
        agg = aggregates.get(name) if name else None
        if agg is None:
            raise Refused(
                f"--accuracy applies to outputs that are COUNT or SUM (or group keys); "
                f"{out.name!r} is not: ask with an epsilon instead"
            )


def _typed_parts(agg: AggregateCall, names: tuple[str, ...], bounded: Bounded) -> Parts:
    """What ``agg`` is made of, named by role: a quantile its selection; any other kind
    the measurements its ``parts`` made (``names``, in their order)."""
    match kind_of(agg.func):
        case Selecting():
            return Measured(names[0])
        case Measuring() as kind:
            return kind.typed(names, bounded.bounds.get(agg.name))
        case unknown:
            assert_never(unknown)


def _key(part: Wanted) -> Key:
    """What a measurement is registered under: its kind (centred, trimmed) and its
    argument's SQL."""
    kind, arg = part.kind, part.arg
    return (
        kind
        + (" centred" if part.counted is not None else "")
        + (f" trimmed {part.trim!r}" if part.trim else ""),
        "*" if arg is None else arg.sql(dialect=DIALECT),
    )


def _want(wanted: dict[Key, Wanted], part: Wanted) -> Key:
    """Register a measurement once, however many aggregates are made of it."""
    key = _key(part)
    wanted.setdefault(key, part)
    return key


def _weights(
    checked: Checked,
    uses: dict[str, tuple[Key, ...]],
    wanted: dict[Key, Wanted],
    c: Contribution,
    dataset: Dataset,
    accountant: Accountant,
) -> dict[Key, float]:
    """Each measurement's weight in the split of the query's budget, as each aggregate
    reading it weighs its parts (``Measuring.weights``, by ``dp.shares``' rules); a
    quantile's selection is weighted by ``dp.shares.total_weight``."""
    demands: dict[Key, list[float]] = {key: [] for key in wanted}
    for agg in checked.aggregates:
        kind = kind_of(agg.func)
        if not isinstance(kind, Measuring):
            continue
        keys = uses[agg.name]
        centred = any(key[0].endswith("centred") for key in keys)
        given = kind.weights(len(keys), centred, c, dataset.neighbouring, accountant.gaussian)
        for key, weight in zip(keys, given, strict=True):
            demands[key].append(weight)
    return {key: measurement_weight(ws) for key, ws in demands.items()}


def _target(target: Target, asked: Cost | None, total: float, weight: float) -> Target:
    """The target of a part of this weight: its share of the query's cost
    (``shares.part_share``); with an accuracy asked for, each part's own least cost."""
    if asked is None:
        return target
    return Target(target.accountant, share=part_share(target.accountant, asked, total, weight))


def _partitions(
    keys: tuple[GroupKey, ...], domains: tuple[KeyDomain, ...]
) -> tuple[tuple[object, ...], ...]:
    size = math.prod(len(d.values) for d in domains)
    if size > MAX_PARTITIONS:
        raise Refused(
            f"GROUP BY {', '.join(k.label for k in keys)} has {size} public key combinations; "
            f"at most {MAX_PARTITIONS} are released at once"
        )
    return tuple(itertools.product(*(d.values for d in domains)))


def _selection(
    name: str,
    level: float,
    arg: exp.Expression,
    clamp: ValueRange,
    label: str,
    target: Target,
    distance: int,
    partitions: int,
    edges: Edges | None,
) -> Selection:
    g = grid(clamp.lo, clamp.hi, clamp.integral)
    if g.size * partitions > MAX_SCORES:
        raise Refused(
            f"{label}: {partitions} groups of {g.size} candidates each are too many to score; "
            "group by fewer keys"
        )
    required(target.share, "a quantile's ε share")  # accuracy-first plans have none
    epsilon = target.pure_epsilon()
    noise = calibrate_quantile(level, g.size, distance, epsilon)
    return Selection(name, arg, g, noise, epsilon, label, edges)


def _measurement(
    name: str,
    part: Wanted,
    target: Target,
    contribution: Contribution,
    rows: int,
    dataset: Dataset,
    count: str | None,
    summand: Summand,
) -> Measurement:
    kind, arg, clamp, label = part.kind, part.arg, part.clamp, part.label
    if kind == MeasureKind.COUNT_UNIT or unit_rows.is_marker(arg):
        contribution = distinct_units(contribution)  # one per unit and partition (``dp/counts``)
    if kind != MeasureKind.SUM:
        # A unit's rows bring at most ``rows`` distinct values to a partition.
        noise = count_noise_for(contribution, dataset.neighbouring, target)
        return Measurement(name, kind, arg, None, 0, noise, spent(noise, target), label)
    clamp = required(clamp, "a sum's bounds")
    grid_exp = 0 if clamp.integral else _grid_exp(clamp, contribution, dataset, target)
    lo, hi = grid_bounds(clamp, grid_exp)
    if rows * max(abs(lo), abs(hi)) >= SUM_LIMIT:
        raise Refused(f"{label}: the declared bounds are too wide to sum exactly")
    centre = None if count is None else _centre(lo, hi, count, clamp.integral, summand)
    step = 2.0**grid_exp
    if centre is not None:
        lo, hi = centred_sums.centred_bounds(
            lo, hi, centre.units, centre.per_grid, summand.counted_exactly
        )
        step /= centre.per_grid
        label = f"{label} centred on {centre.value(step):g}"
    sensitivity = sum_sensitivity(lo, hi, contribution, dataset.neighbouring)
    if sensitivity > _I64_MAX:
        raise Refused(f"{label}: the declared bounds are too wide to sum exactly")
    noise = noise_for(lo, hi, contribution, dataset.neighbouring, target, step)
    return Measurement(
        name,
        kind,
        arg,
        clamp,
        grid_exp,
        noise,
        spent(noise, target),
        label,
        centre,
        summand,
        part.trim,
    )


def _centre(lo: int, hi: int, count: str, integral: bool, summand: Summand) -> Centre | None:
    """The centre ``dp.centred_sums`` chooses for a sum of ``count``'s rows."""
    found = centred_sums.centre(lo, hi, integral, summand.counted_exactly)
    return None if found is None else Centre(count, *found)


def _summand(part: Wanted, resolved: Resolved) -> Summand:
    """How a sum's SQL reads each row's value (``Summand``): a bare declared number
    column of the sum's type is NULL exactly where it is NULL (the load stored it of
    its type), and needs no clamp where its declared bounds lie within the sum's."""
    kind, arg, clamp = part.kind, part.arg, part.clamp
    col = resolved.column(arg) if kind == MeasureKind.SUM and arg is not None else None
    if col is None or clamp is None or col.type != ("int" if clamp.integral else "float"):
        return Summand.CAST
    lower, upper = col.lower, col.upper
    if lower is not None and upper is not None and clamp.lo <= lower and upper <= clamp.hi:
        return Summand.STORED
    return Summand.TYPED


def _grid_exp(clamp: ValueRange, c: Contribution, dataset: Dataset, target: Target) -> int:
    """The grid for summing floats: fine beside the noise, coarse enough to fit 128 bits."""
    real = sum_sensitivity(math.floor(clamp.lo), math.ceil(clamp.hi), c, dataset.neighbouring)
    scale = max(target.scale_estimate(real), 2.0**-1000)
    k = math.floor(math.log2(scale)) - GRID_BITS_BELOW_SCALE
    widest = max(abs(clamp.lo), abs(clamp.hi), 1.0)
    # Keep a single value below 2**62 grid units: then Δ fits OpenDP's i64 and
    # ``partition_rows`` of them (below 2**62) fit a 128-bit sum.
    return max(k, math.ceil(math.log2(widest)) - 62 + math.ceil(math.log2(c.rows * 2 * c.groups)))
