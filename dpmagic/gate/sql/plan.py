"""Pass 5: the DP plan — partitions, measurements, sensitivities, cost.

Each DP aggregate becomes one or two *measurements*: a count, or a sum of a
clamped value on an integer grid (AVG is a sum and a count, post-processed).
A measurement is one vector over all released partitions, noised once; its
L1 sensitivity follows from the contribution bounds (see ``sensitivity``).
The query's ε is split evenly over its measurements, and nothing in this
pass looks at data: the cost is a function of the query and the policy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.accounting import Accountant, Cost
from dpmagic.gate.errors import Refused
from dpmagic.gate.mechanisms import LaplaceNoise, calibrate
from dpmagic.gate.policy import Column, Dataset, Table
from dpmagic.gate.sensitivity import Contribution, count_sensitivity, sum_sensitivity
from dpmagic.gate.sql.bound import Bounded, Interval
from dpmagic.gate.sql.check import Checked
from dpmagic.gate.sql.contribution import contribution as unit_contribution
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
    cost: Cost

    def measurement(self, name: str) -> Measurement:
        return next(m for m in self.measurements if m.name == name)


def plan(bounded: Bounded, epsilon: float, delta: float, accountant: Accountant) -> Plan:
    checked = bounded.checked
    dataset = checked.resolved.dataset
    cost = accountant.query_cost(epsilon, delta)
    partitions = _partitions(checked.keys)
    contribution = unit_contribution(dataset, bool(checked.keys), len(partitions))

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

    share = cost.epsilon / len(wanted)
    names = {key: f"m{i}" for i, key in enumerate(wanted)}
    measurements = tuple(
        _measurement(names[key], kind, arg, clamp, label, share, contribution, dataset)
        for key, (kind, arg, clamp, label) in wanted.items()
    )
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
    epsilon: float,
    contribution: Contribution,
    dataset: Dataset,
) -> Measurement:
    if kind == "count":
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
