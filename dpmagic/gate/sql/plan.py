"""Pass 5: the DP plan — partitions, measurements, sensitivities, cost.

Each DP aggregate becomes one or more *measurements*: a count, a count of
distinct values, or a sum of a clamped value on an integer grid (AVG is a
sum and a count; a variance a count, a sum and a sum of squares, all
post-processed). A measurement is one vector over all released partitions,
noised once; its sensitivity follows from the contribution bounds (see
``sensitivity``). Quantiles (MIN, MAX, MEDIAN, percentiles) are *selections*:
an exponential mechanism per partition (see ``selection``). The query's
budget is split evenly over measurements and selections, or, when an
accuracy is asked for, each measurement gets the least cost that delivers
it (``calibration``). Nothing in this pass looks at data: the cost is a
function of the query and the policy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from sqlglot import exp

from dpmagic.gate.accounting import Accountant, Cost
from dpmagic.gate.calibration import Accuracy, Target, noise_for, spent
from dpmagic.gate.errors import Refused
from dpmagic.gate.mechanisms import Noise
from dpmagic.gate.partition_selection import KeySelection, calibrate_selection
from dpmagic.gate.policy import Dataset
from dpmagic.gate.selection import Grid, QuantileNoise, calibrate_quantile, grid
from dpmagic.gate.sensitivity import (
    Contribution,
    selection_distance,
    sum_sensitivity,
)
from dpmagic.gate.sql.bound import Bounded, Interval
from dpmagic.gate.sql.check import AggregateCall, Checked, GroupKey
from dpmagic.gate.sql.contribution import contribution as unit_contribution
from dpmagic.gate.sql.contribution import ranked_rows
from dpmagic.gate.sql.keys import MAX_PARTITIONS, KeyDomain
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.randomized import Debias, debiasing
from dpmagic.gate.sql.resolve import Resolved

MAX_SCORES = 2_000_000  # candidates scored over all partitions of one quantile
# No table served by one DuckDB process has more rows than this; with it the
# rewrite's 128-bit sums are proven not to overflow before the query runs.
MAX_ROWS = 2**40
SUM_LIMIT = 2**126
# The partition count sensitivities assume when the keys are chosen from the data:
# larger than any two units' reach, so no overlap between them is counted on.
ANY_PARTITIONS = 2**31
# Summed floats are rounded to a grid this many binary digits finer than the
# noise scale, so rounding is negligible beside the noise.
GRID_BITS_BELOW_SCALE = 24
_I64_MAX = 2**63 - 1
# Aggregates whose every cell is one noisy measurement: an accuracy can be promised.
_PROMISED = ("count", "count_distinct", "sum")


@dataclass(frozen=True)
class Measurement:
    """One noisy vector: a count, a count of distinct values, or a sum of values on
    the ``2**grid_exp`` grid."""

    name: str  # its column in the generated SQL
    kind: str  # count | count_distinct | count_unit (COUNT(DISTINCT unit)) | sum
    arg: exp.Expression | None  # None: COUNT(*)
    clamp: Interval | None  # sums: each value is clamped into this before summing
    grid_exp: int  # sums of floats: values are rounded to multiples of 2**grid_exp
    noise: Noise
    cost: Cost  # what this measurement's noise costs one privacy unit
    label: str

    @property
    def sensitivity(self) -> float:
        """L1 (Laplace) or L2 (Gaussian) sensitivity in released units."""
        return self.noise.sensitivity * self.noise.granularity

    @property
    def scale(self) -> float:
        return self.noise.scale * self.noise.granularity


@dataclass(frozen=True)
class Selection:
    """A quantile per partition: one candidate of ``grid`` chosen by the exponential
    mechanism from the histogram of the argument's values snapped to the grid."""

    name: str
    arg: exp.Expression
    grid: Grid
    noise: QuantileNoise
    epsilon: float
    label: str

    @property
    def sensitivity(self) -> int:
        """Symmetric distance one unit can cause in the snapped values, over all partitions."""
        return self.noise.distance

    @property
    def scale(self) -> float:
        return self.noise.scale


@dataclass(frozen=True)
class Plan:
    checked: Checked
    dataset: Dataset
    keys: tuple[GroupKey, ...]
    domains: tuple[KeyDomain, ...]
    partitions: tuple[tuple[object, ...], ...]
    contribution: Contribution
    measurements: tuple[Measurement, ...]
    selections: tuple[Selection, ...]
    uses: dict[str, tuple[str, ...]]  # aggregate name -> the measurements it is made of
    epsilon: float
    cost: Cost  # what is charged: the group's cost under the policy's group_size
    unit_cost: Cost  # what the noise costs one privacy unit
    accuracy: Accuracy | None = None
    # Private keys: ``partitions`` is empty and the keys released are those this keeps.
    key_selection: KeySelection | None = None
    # aggregate name -> how release undoes a randomized-response column's randomization
    debiased: dict[str, Debias] = field(default_factory=dict)

    def measurement(self, name: str) -> Measurement:
        return next(m for m in self.measurements if m.name == name)

    def selection(self, name: str) -> Selection:
        return next(s for s in self.selections if s.name == name)


# A measurement before calibration: (kind, argument, clamp, label).
Wanted = tuple[str, exp.Expression | None, Interval | None, str]


def plan(
    bounded: Bounded,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    accuracy: Accuracy | None = None,
) -> Plan:
    """With ``accuracy``, ``epsilon`` is ignored: the cost is the least that gives it."""
    checked = bounded.checked
    resolved = checked.resolved
    dataset = resolved.dataset
    debiased = debiasing(checked)
    if accuracy is not None:
        _accuracy_applies(checked, debiased)
    asked = None if accuracy is not None else accountant.query_cost(epsilon, delta)
    private = next((d.private for d in bounded.domains if d.private), None)
    if private is not None:
        _private_keys_allowed(private, accountant, delta, accuracy)
        if any(d.key is not None for d in debiased.values()):
            # Debiasing a count needs every value of the column in each group.
            raise Refused(
                f"{private}: a randomized-response column can only be grouped with public keys"
            )
    partitions = () if private else _partitions(checked.keys, bounded.domains)
    reach = ANY_PARTITIONS if private else len(partitions)

    wanted: dict[tuple[str, str], Wanted] = {}
    quantiles: dict[tuple[float, str], tuple[exp.Expression, Interval, str]] = {}
    uses: dict[str, tuple[tuple[str, str], ...]] = {}
    for agg in checked.aggregates:
        if agg.func == "quantile":
            assert agg.arg is not None and agg.level is not None
            key = (agg.level, agg.arg.sql(dialect=DIALECT))
            quantiles.setdefault(key, (agg.arg, bounded.bounds[agg.name], agg.label))
            uses[agg.name] = (("quantile", f"{key[0]}|{key[1]}"),)
            continue
        uses[agg.name] = tuple(
            _want(wanted, kind, arg, clamp, label)
            for kind, arg, clamp, label in _parts(
                agg, bounded.bounds.get(agg.name), resolved, agg.name in debiased
            )
        )

    kinds = {kind for kind, *_ in wanted.values()}
    ranked = None if private else ranked_rows(dataset, resolved, bool(checked.keys), reach, kinds)
    contribution = unit_contribution(dataset, ranked, bool(checked.keys), reach)
    parts = len(wanted) + len(quantiles) + (1 if private else 0)
    share = None if asked is None else accountant.share(asked, parts)
    target = Target(accountant, share=share, accuracy=accuracy)
    names = {key: f"m{i}" for i, key in enumerate(wanted)}
    measurements = tuple(
        _measurement(names[key], kind, arg, clamp, label, target, contribution, dataset)
        for key, (kind, arg, clamp, label) in wanted.items()
    )
    if asked is None:
        asked = accountant.total((m.cost for m in measurements), delta)
    cost = accountant.group(asked, dataset.group_size) if dataset.group_size > 1 else asked
    for i, key in enumerate(quantiles):
        names[("quantile", f"{key[0]}|{key[1]}")] = f"q{i}"
    distance = selection_distance(contribution, dataset.neighbouring)
    selections = tuple(
        _selection(f"q{i}", level, arg, clamp, label, target, distance, len(partitions) or 1)
        for i, ((level, _), (arg, clamp, label)) in enumerate(quantiles.items())
    )
    key_selection = None
    if private is not None:
        assert share is not None
        key_selection = _key_selection(contribution, dataset, share)
    return Plan(
        checked=checked,
        dataset=dataset,
        keys=checked.keys,
        domains=bounded.domains,
        partitions=partitions,
        contribution=contribution,
        measurements=measurements,
        selections=selections,
        uses={name: tuple(names[k] for k in parts) for name, parts in uses.items()},
        epsilon=cost.epsilon,
        cost=cost,
        unit_cost=asked,
        accuracy=accuracy,
        key_selection=key_selection,
        debiased=debiased,
    )


def _private_keys_allowed(
    reason: str, accountant: Accountant, delta: float, accuracy: Accuracy | None
) -> None:
    """Keys read from the data are released only by DP partition selection, whose
    (ε, δ) the approx accountant can charge; say what would make the query possible."""
    if accountant.name == "pure":
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


def _key_selection(c: Contribution, dataset: Dataset, share: Cost) -> KeySelection:
    """A unit counts once in each of the ``c.groups`` keys it may reach; replaced by
    another unit, it leaves its keys and the other reaches as many new ones."""
    l0 = c.groups * (2 if dataset.neighbouring == "substitute" else 1)
    return calibrate_selection(l0, 1, share.epsilon, share.delta)


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
    other = next((a for a in checked.aggregates if a.func not in _PROMISED), None)
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


def _parts(
    agg: AggregateCall, clamp: Interval | None, resolved: Resolved, debiased: bool = False
) -> list[Wanted]:
    """The noisy counts and sums an aggregate is post-processed from.

    Debiasing a randomized-response sum needs how many answers it adds up, so
    such a SUM is measured with its count, as AVG is. A variance is computed
    from the count, the sum and the sum of squares of the values' distance to
    the middle of their bounds: centring halves the range summed, and so the
    noise, without changing the variance.
    """
    arg = agg.arg
    arg_sql = "*" if arg is None else _display(arg)
    if agg.func == "count":
        return [("count", arg, None, f"COUNT({arg_sql})")]
    if agg.func == "count_distinct":
        kind = "count_unit" if resolved.is_unit(arg) else "count_distinct"
        return [(kind, arg, None, f"COUNT(DISTINCT {arg_sql})")]
    assert arg is not None and clamp is not None
    total: Wanted = ("sum", arg, clamp, f"SUM({arg_sql})")
    count: Wanted = ("count", arg, None, f"COUNT({arg_sql})")
    if agg.func == "sum":
        return [total, count] if debiased else [total]
    if agg.func == "avg":
        return [total, count]
    centre = math.floor((clamp.lo + clamp.hi) / 2) if clamp.integral else (clamp.lo + clamp.hi) / 2
    number = exp.Literal.number(centre if clamp.integral else repr(float(centre)))
    deviation = exp.Sub(this=exp.Paren(this=arg.copy()), expression=exp.Paren(this=number))
    square = exp.Mul(this=exp.Paren(this=deviation.copy()), expression=exp.Paren(this=deviation))
    reach = max(centre - clamp.lo, clamp.hi - centre)
    return [
        count,
        ("sum", deviation, Interval(clamp.lo - centre, clamp.hi - centre, clamp.integral),
         f"SUM({arg_sql} - {centre})"),
        ("sum", square, Interval(0, reach * reach, clamp.integral),
         f"SUM(({arg_sql} - {centre})^2)"),
    ]  # fmt: skip


def _want(
    wanted: dict, kind: str, arg: exp.Expression | None, clamp: Interval | None, label: str
) -> tuple[str, str]:
    """Register a measurement once, however many aggregates are made of it."""
    key = (kind, "*" if arg is None else arg.sql(dialect=DIALECT))
    wanted.setdefault(key, (kind, arg, clamp, label))
    return key


def _display(arg: exp.Expression) -> str:
    def bare(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.table.startswith("__s"):
            return exp.column(n.name)
        return n

    return arg.copy().transform(bare).sql(dialect=DIALECT)


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
    clamp: Interval,
    label: str,
    target: Target,
    distance: int,
    partitions: int,
) -> Selection:
    g = grid(clamp.lo, clamp.hi, clamp.integral)
    if g.size * partitions > MAX_SCORES:
        raise Refused(
            f"{label}: {partitions} groups of {g.size} candidates each are too many to score; "
            "group by fewer keys"
        )
    assert target.share is not None  # accuracy-first plans have no selections
    epsilon = target.pure_epsilon()
    noise = calibrate_quantile(level, g.size, distance, epsilon)
    return Selection(name, arg, g, noise, epsilon, label)


def _measurement(
    name: str,
    kind: str,
    arg: exp.Expression | None,
    clamp: Interval | None,
    label: str,
    target: Target,
    contribution: Contribution,
    dataset: Dataset,
) -> Measurement:
    if kind == "count_unit":  # COUNT(DISTINCT unit): one per unit and partition
        contribution = Contribution(contribution.groups, 1, contribution.partitions)
    if kind in ("count", "count_distinct", "count_unit"):
        # A unit's rows bring at most ``rows`` distinct values to a partition.
        noise = noise_for(1, 1, contribution, dataset.neighbouring, target)
        return Measurement(name, kind, arg, None, 0, noise, spent(noise, target), label)
    assert clamp is not None
    grid_exp = 0 if clamp.integral else _grid_exp(clamp, contribution, dataset, target)
    lo, hi = _grid_bounds(clamp, grid_exp)
    sensitivity = sum_sensitivity(lo, hi, contribution, dataset.neighbouring)
    if sensitivity > _I64_MAX or MAX_ROWS * max(abs(lo), abs(hi)) >= SUM_LIMIT:
        raise Refused(f"{label}: the declared bounds are too wide to sum exactly")
    noise = noise_for(lo, hi, contribution, dataset.neighbouring, target, 2.0**grid_exp)
    return Measurement(name, kind, arg, clamp, grid_exp, noise, spent(noise, target), label)


def _grid_exp(clamp: Interval, c: Contribution, dataset: Dataset, target: Target) -> int:
    """The grid for summing floats: fine beside the noise, coarse enough to fit 128 bits."""
    real = sum_sensitivity(math.floor(clamp.lo), math.ceil(clamp.hi), c, dataset.neighbouring)
    scale = max(target.scale_estimate(real), 2.0**-1000)
    k = math.floor(math.log2(scale)) - GRID_BITS_BELOW_SCALE
    widest = max(abs(clamp.lo), abs(clamp.hi), 1.0)
    # Keep a single value below 2**62 grid units: then Δ fits OpenDP's i64 and
    # MAX_ROWS of them fit a 128-bit sum.
    return max(k, math.ceil(math.log2(widest)) - 62 + math.ceil(math.log2(c.rows * 2 * c.groups)))


def _grid_bounds(clamp: Interval, grid_exp: int) -> tuple[int, int]:
    """Integer bounds of a clamped value rounded to the grid: whichever way the SQL
    rounds a value in ``[lo, hi]``, it lands within ``[floor(lo), ceil(hi)]``."""
    step = 2.0**grid_exp
    return math.floor(clamp.lo / step), math.ceil(clamp.hi / step)
