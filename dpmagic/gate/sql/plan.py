"""Pass 5: the DP plan — partitions, measurements, sensitivities, cost.

Each DP aggregate becomes one or more *measurements*: a count, a count of
distinct values, or a sum of a clamped value on an integer grid (AVG is a
sum and a count; a variance a count, a sum and a sum of squares, all
post-processed). A measurement is one vector over all released partitions,
noised once; its L1 sensitivity follows from the contribution bounds (see
``sensitivity``). Quantiles (MIN, MAX, MEDIAN, percentiles) are *selections*:
an exponential mechanism per partition (see ``selection``). The query's ε is
split evenly over measurements and selections, and nothing in this pass
looks at data: the cost is a function of the query and the policy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.accounting import Accountant, Cost
from dpmagic.gate.errors import Refused
from dpmagic.gate.mechanisms import LaplaceNoise, calibrate
from dpmagic.gate.policy import Dataset
from dpmagic.gate.selection import Grid, QuantileNoise, calibrate_quantile, grid
from dpmagic.gate.sensitivity import (
    Contribution,
    count_sensitivity,
    selection_distance,
    sum_sensitivity,
)
from dpmagic.gate.sql.bound import Bounded, Interval
from dpmagic.gate.sql.check import AggregateCall, Checked, GroupKey
from dpmagic.gate.sql.contribution import contribution as unit_contribution
from dpmagic.gate.sql.contribution import ranked_rows
from dpmagic.gate.sql.keys import MAX_PARTITIONS, KeyDomain
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.resolve import Resolved

MAX_SCORES = 2_000_000  # candidates scored over all partitions of one quantile
# No table served by one DuckDB process has more rows than this; with it the
# rewrite's 128-bit sums are proven not to overflow before the query runs.
MAX_ROWS = 2**40
SUM_LIMIT = 2**126
# Summed floats are rounded to a grid this many binary digits finer than the
# noise scale, so rounding is negligible beside the noise.
GRID_BITS_BELOW_SCALE = 24
_I64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Measurement:
    """One noisy vector: a count, a count of distinct values, or a sum of values on
    the ``2**grid_exp`` grid."""

    name: str  # its column in the generated SQL
    kind: str  # count | count_distinct | count_unit (COUNT(DISTINCT unit)) | sum
    arg: exp.Expression | None  # None: COUNT(*)
    clamp: Interval | None  # sums: each value is clamped into this before summing
    grid_exp: int  # sums of floats: values are rounded to multiples of 2**grid_exp
    noise: LaplaceNoise
    epsilon: float
    label: str

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity in released units."""
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
    cost: Cost

    def measurement(self, name: str) -> Measurement:
        return next(m for m in self.measurements if m.name == name)

    def selection(self, name: str) -> Selection:
        return next(s for s in self.selections if s.name == name)


# A measurement before calibration: (kind, argument, clamp, label).
Wanted = tuple[str, exp.Expression | None, Interval | None, str]


def plan(bounded: Bounded, epsilon: float, delta: float, accountant: Accountant) -> Plan:
    checked = bounded.checked
    resolved = checked.resolved
    dataset = resolved.dataset
    cost = accountant.query_cost(epsilon, delta)
    partitions = _partitions(checked.keys, bounded.domains)

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
            for kind, arg, clamp, label in _parts(agg, bounded.bounds.get(agg.name), resolved)
        )

    kinds = {kind for kind, *_ in wanted.values()}
    ranked = ranked_rows(dataset, resolved, bool(checked.keys), len(partitions), kinds)
    contribution = unit_contribution(dataset, ranked, bool(checked.keys), len(partitions))
    shares = len(wanted) + len(quantiles)
    share = cost.epsilon / shares
    names = {key: f"m{i}" for i, key in enumerate(wanted)}
    measurements = tuple(
        _measurement(names[key], kind, arg, clamp, label, share, contribution, dataset)
        for key, (kind, arg, clamp, label) in wanted.items()
    )
    for i, key in enumerate(quantiles):
        names[("quantile", f"{key[0]}|{key[1]}")] = f"q{i}"
    distance = selection_distance(contribution, dataset.neighbouring)
    selections = tuple(
        _selection(f"q{i}", level, arg, clamp, label, share, distance, len(partitions))
        for i, ((level, _), (arg, clamp, label)) in enumerate(quantiles.items())
    )
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
    )


def _parts(agg: AggregateCall, clamp: Interval | None, resolved: Resolved) -> list[Wanted]:
    """The noisy counts and sums an aggregate is post-processed from.

    A variance is computed from the count, the sum and the sum of squares of
    the values' distance to the middle of their bounds: centring halves the
    range summed, and so the noise, without changing the variance.
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
        return [total]
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
    epsilon: float,
    distance: int,
    partitions: int,
) -> Selection:
    g = grid(clamp.lo, clamp.hi, clamp.integral)
    if g.size * partitions > MAX_SCORES:
        raise Refused(
            f"{label}: {partitions} groups of {g.size} candidates each are too many to score; "
            "group by fewer keys"
        )
    noise = calibrate_quantile(level, g.size, distance, epsilon)
    return Selection(name, arg, g, noise, epsilon, label)


def _measurement(
    name: str,
    kind: str,
    arg: exp.Expression | None,
    clamp: Interval | None,
    label: str,
    epsilon: float,
    contribution: Contribution,
    dataset: Dataset,
) -> Measurement:
    if kind == "count_unit":  # COUNT(DISTINCT unit): one per unit and partition
        contribution = Contribution(contribution.groups, 1, contribution.partitions)
    if kind in ("count", "count_distinct", "count_unit"):
        # A unit's rows bring at most ``rows`` distinct values to a partition.
        sensitivity = count_sensitivity(contribution, dataset.neighbouring)
        noise = calibrate(sensitivity, epsilon)
        return Measurement(name, kind, arg, None, 0, noise, epsilon, label)
    assert clamp is not None
    grid_exp = 0 if clamp.integral else _grid_exp(clamp, contribution, dataset, epsilon)
    lo, hi = _grid_bounds(clamp, grid_exp)
    sensitivity = sum_sensitivity(lo, hi, contribution, dataset.neighbouring)
    if sensitivity > _I64_MAX or MAX_ROWS * max(abs(lo), abs(hi)) >= SUM_LIMIT:
        raise Refused(f"{label}: the declared bounds are too wide to sum exactly")
    noise = calibrate(sensitivity, epsilon, granularity=2.0**grid_exp)
    return Measurement(name, kind, arg, clamp, grid_exp, noise, epsilon, label)


def _grid_exp(clamp: Interval, c: Contribution, dataset: Dataset, epsilon: float) -> int:
    """The grid for summing floats: fine beside the noise, coarse enough to fit 128 bits."""
    real = sum_sensitivity(math.floor(clamp.lo), math.ceil(clamp.hi), c, dataset.neighbouring)
    scale = max(real / epsilon, 2.0**-1000)
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
