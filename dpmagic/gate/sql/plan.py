"""Pass 5: the DP plan — partitions, measurements, sensitivities, cost.

Each DP aggregate becomes one or two *measurements*: a count, or a sum of a
clamped value on an integer grid (AVG is a sum and a count, post-processed).
A measurement is one vector over all released partitions, noised once; its
sensitivity follows from the contribution bounds (see ``sensitivity``).
The query's budget is split evenly over its measurements, or, when an
accuracy is asked for, each measurement gets the least cost that delivers
it (``calibration``). Nothing in this pass looks at data: the cost is a
function of the query and the policy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.accounting import Accountant, Cost
from dpmagic.gate.calibration import Accuracy, Target, noise_for, spent
from dpmagic.gate.errors import Refused
from dpmagic.gate.mechanisms import Noise
from dpmagic.gate.policy import Column, Dataset, Table
from dpmagic.gate.sensitivity import Contribution, sum_sensitivity
from dpmagic.gate.sql.bound import Bounded, Interval
from dpmagic.gate.sql.check import Checked
from dpmagic.gate.sql.parse import DIALECT

MAX_PARTITIONS = 100_000
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
    """One noisy vector: a count, or a sum of values on the ``2**grid_exp`` grid."""

    name: str  # its column in the generated SQL
    kind: str  # count | sum
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
class Plan:
    checked: Checked
    dataset: Dataset
    table: Table
    keys: tuple[Column, ...]
    partitions: tuple[tuple[object, ...], ...]
    contribution: Contribution
    measurements: tuple[Measurement, ...]
    uses: dict[str, tuple[str, ...]]  # aggregate label -> the measurements it is made of
    epsilon: float
    cost: Cost  # what is charged: the group's cost under the policy's group_size
    unit_cost: Cost  # what the noise costs one privacy unit
    accuracy: Accuracy | None = None

    def measurement(self, name: str) -> Measurement:
        return next(m for m in self.measurements if m.name == name)


def plan(
    bounded: Bounded,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    accuracy: Accuracy | None = None,
) -> Plan:
    """With ``accuracy``, ``epsilon`` is ignored: the cost is the least that gives it."""
    checked = bounded.checked
    dataset = checked.resolved.dataset
    if accuracy is not None:
        _accuracy_applies(checked)
    asked = None if accuracy is not None else accountant.query_cost(epsilon, delta)
    partitions = _partitions(checked.keys)
    if dataset.privacy_unit is None:
        contribution = Contribution.bounded(1, 1, len(partitions))
    else:
        groups = dataset.max_partitions if checked.keys else 1
        contribution = Contribution.bounded(groups, dataset.max_rows_per_partition, len(partitions))

    wanted: dict[tuple[str, str], tuple[str, exp.Expression | None, Interval | None, str]] = {}
    uses: dict[str, tuple[str, ...]] = {}
    for agg in checked.aggregates:
        parts = []
        arg_sql = "*" if agg.arg is None else agg.arg.sql(dialect=DIALECT)
        if agg.func in ("sum", "avg"):
            key = ("sum", arg_sql)
            wanted.setdefault(key, ("sum", agg.arg, bounded.bounds[agg.label], f"SUM({arg_sql})"))
            parts.append(key)
        if agg.func in ("count", "avg"):
            key = ("count", arg_sql)
            wanted.setdefault(key, ("count", agg.arg, None, f"COUNT({arg_sql})"))
            parts.append(key)
        uses[agg.label] = tuple(parts)  # type: ignore[assignment]

    share = None if asked is None else accountant.share(asked, len(wanted))
    target = Target(accountant, share=share, accuracy=accuracy)
    names = {key: f"m{i}" for i, key in enumerate(wanted)}
    measurements = tuple(
        _measurement(names[key], kind, arg, clamp, label, target, contribution, dataset)
        for key, (kind, arg, clamp, label) in wanted.items()
    )
    if asked is None:
        asked = accountant.total((m.cost for m in measurements), delta)
    cost = accountant.group(asked, dataset.group_size) if dataset.group_size > 1 else asked
    return Plan(
        checked=checked,
        dataset=dataset,
        table=checked.resolved.table,
        keys=checked.keys,
        partitions=partitions,
        contribution=contribution,
        measurements=measurements,
        uses={label: tuple(names[k] for k in parts) for label, parts in uses.items()},
        epsilon=cost.epsilon,
        cost=cost,
        unit_cost=asked,
        accuracy=accuracy,
    )


def _accuracy_applies(checked: Checked) -> None:
    """An accuracy can be promised, before seeing data, only for cells that are one
    noisy count or sum: an average's interval depends on its noisy count."""
    aggregates = {a.label: a for a in checked.aggregates}
    for out in checked.outputs:
        node = out.expr
        if isinstance(node, exp.Column):
            continue
        agg = aggregates.get(node.sql(dialect=DIALECT)) if isinstance(node, exp.AggFunc) else None
        if agg is None or agg.func not in ("count", "sum"):
            raise Refused(
                f"--accuracy applies to outputs that are COUNT or SUM (or group keys); "
                f"{out.name!r} is not: ask with an epsilon instead"
            )


def _partitions(keys: tuple[Column, ...]) -> tuple[tuple[object, ...], ...]:
    size = math.prod(len(k.public_values or ()) for k in keys)
    if size > MAX_PARTITIONS:
        raise Refused(
            f"GROUP BY {', '.join(k.name for k in keys)} has {size} public key combinations; "
            f"at most {MAX_PARTITIONS} are released at once"
        )
    return tuple(itertools.product(*(k.public_values or () for k in keys)))


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
    if kind == "count":
        noise = noise_for(1, 1, contribution, dataset.neighbouring, target)
        cost = spent(noise, target.accountant)
        return Measurement(name, kind, arg, None, 0, noise, cost, label)
    assert clamp is not None
    grid_exp = 0 if clamp.integral else _grid_exp(clamp, contribution, dataset, target)
    lo, hi = _grid_bounds(clamp, grid_exp)
    sensitivity = sum_sensitivity(lo, hi, contribution, dataset.neighbouring)
    if sensitivity > _I64_MAX or MAX_ROWS * max(abs(lo), abs(hi)) >= SUM_LIMIT:
        raise Refused(f"{label}: the declared bounds are too wide to sum exactly")
    noise = noise_for(lo, hi, contribution, dataset.neighbouring, target, 2.0**grid_exp)
    return Measurement(
        name, kind, arg, clamp, grid_exp, noise, spent(noise, target.accountant), label
    )


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
