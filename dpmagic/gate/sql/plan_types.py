"""The plan's typed values: what the plan pass (``plan.py``) decides and every later
pass reads: the measurements and selections with their noises, what each aggregate is
made of (``Parts``, from ``aggregates.parts``), and the ``Plan`` that holds them.
Values only: how they are chosen is ``plan.py``'s, and every privacy number in them is
a rule of ``dp/``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter

from sqlglot import exp

from dpmagic.gate.dp.accounting import Cost
from dpmagic.gate.dp.calibration import Accuracy
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.left_out import LeftOut
from dpmagic.gate.dp.mechanisms import Noise
from dpmagic.gate.dp.partition_selection import KeySelection
from dpmagic.gate.dp.quantile_selection import Grid, QuantileNoise
from dpmagic.gate.engines.interface import MAX_ROWS
from dpmagic.gate.policy import Dataset
from dpmagic.gate.sql import unit_rows
from dpmagic.gate.sql.aggregates.debiasing import Debias
from dpmagic.gate.sql.aggregates.parts import Parts
from dpmagic.gate.sql.check import Checked, GroupKey
from dpmagic.gate.sql.keys import KeyDomain
from dpmagic.gate.sql.kinds import MeasureKind, Summand
from dpmagic.gate.sql.ranks import Bounding, Ranked, Window
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.value_range import ValueRange
from dpmagic.gate.sql.work import Work


@dataclass(frozen=True)
class Centre:
    """A sum noised around the middle of its values' range instead of around 0: the
    SQL's exact sum and ``count`` of its rows, moved by ``units/per_grid`` grid units
    (``dp.centred_sums`` states the rule and its proof)."""

    count: str
    units: int
    per_grid: int

    def value(self, granularity: float) -> float:
        """The centre in released units, for a noise of this ``granularity``."""
        return self.units * granularity


@dataclass(frozen=True)
class Measurement:
    """One noisy vector: a count, a count of distinct values, or a sum of values on
    the ``2**grid_exp`` grid (centred when ``centre`` is set)."""

    name: str  # its column in the generated SQL
    kind: MeasureKind
    arg: exp.Expression | None  # None: COUNT(*)
    clamp: ValueRange | None  # sums: each value is clamped into this before summing
    grid_exp: int  # sums of floats: values are rounded to multiples of 2**grid_exp
    noise: Noise
    cost: Cost  # what this measurement's noise costs one privacy unit
    label: str
    centre: Centre | None = None
    summand: Summand = Summand.CAST  # sums: how the SQL reads each row's value
    # Sums: the share of each partition's values left out at each end before summing
    # (``aggregates.trimmed_mean``, whose sensitivity is a plain sum's); 0: none.
    trim: float = 0.0

    @property
    def bounds(self) -> ValueRange:
        """A sum's clamp. A count has none: asking for it is the gate's own bug."""
        if self.clamp is None:
            raise ValueError(f"measurement {self.name} is a count: it has no bounds")
        return self.clamp

    @property
    def grid_range(self) -> tuple[int, int]:
        """A sum's smallest and largest value on its grid, as the SQL rounds it."""
        return grid_bounds(self.bounds, self.grid_exp)

    @property
    def centre_value(self) -> float:
        """What the released value is centred on, in released units (0 when plain)."""
        return 0.0 if self.centre is None else self.centre.value(self.noise.granularity)

    @property
    def sensitivity(self) -> float:
        """L1 (Laplace) or L2 (Gaussian) sensitivity in released units."""
        return self.noise.sensitivity * self.noise.granularity

    @property
    def scale(self) -> float:
        return self.noise.scale * self.noise.granularity


@dataclass(frozen=True)
class Edges:
    """A quantile's interval in the column's units (``edges``): two more selections
    per group from the same histograms, at levels set by measurement ``count`` (a
    ``COUNT`` of the same argument), each with ``epsilon``."""

    count: str
    epsilon: float


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
    edges: Edges | None  # None: no interval in units (a clip's bounds need none)

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
    bounding: Bounding  # how the SQL bounds each unit's rows, which ``contribution`` is of
    contribution: Contribution
    work: Work  # what one unit can add to the query's work (``work.py``), within the policy's
    measurements: tuple[Measurement, ...]
    selections: tuple[Selection, ...]
    parts: dict[str, Parts]  # aggregate name -> the measurements it is made of
    epsilon: float
    cost: Cost  # what is charged: the group's cost under the policy's group_size
    unit_cost: Cost  # what the noise costs one privacy unit
    accuracy: Accuracy | None = None
    # Private keys: ``partitions`` is empty and the keys released are those this keeps.
    key_selection: KeySelection | None = None
    # aggregate name -> how release undoes a randomized-response column's randomization
    debiased: dict[str, Debias] = field(default_factory=dict)
    left_out: LeftOut | None = None  # the bounding report, when one was asked for

    def measurement(self, name: str) -> Measurement:
        return next(m for m in self.measurements if m.name == name)

    @property
    def listed_at_fetch(self) -> bool:
        """Whether keys declared value by value are tested as the exact result is
        fetched (``noise.declared_keys``) rather than row by row in the SQL.

        Testing each row against a list costs DuckDB more than the aggregation (50
        strings: 2 of 4 ms a query on 1M rows), and it makes no difference to what
        is released when no window bounds a unit per group: each group is then
        aggregated from its own rows only, and a group whose key is not declared is
        dropped before noise (``noise``), unseen. Under the window it must stay in
        the SQL: a unit's rows with an undeclared key would take its group slots.
        A whole integer range stays one ``BETWEEN``, which costs nothing."""
        return not isinstance(self.bounding, Window) and self.key_selection is None

    @property
    def reads_unit(self) -> bool:
        """Whether the SQL carries each row's unit. The window bounds rows per unit and
        the bounding report counts them per unit; but under the load-time ranks no
        aggregate reads it (distinct units and chosen keys take the window), and no
        row's unit is NULL (load drops such rows), so reading and testing it would
        only cost a column (count by state, 100M rows: one more BIGINT scanned). Rows
        counted per person (``--clip``) read it."""
        if self.checked.resolved.unit is None:
            return False
        if any(unit_rows.is_marker(s.arg) for s in self.selections):
            return True  # counted per unit (``rewrite._unit_rows``)
        return not isinstance(self.bounding, Ranked) or self.left_out is not None

    @cached_property
    def declared_keys(self) -> frozenset[object]:
        """The released partitions as a row's keys are matched to them (``keyed``)."""
        _, partition_key = keyed(len(self.keys))
        return frozenset(map(partition_key, self.partitions))

    @cached_property
    def partition_rows(self) -> int:
        """More rows than any aggregate of the query adds up in one partition (the
        function ``partition_rows``)."""
        return partition_rows(self.checked.resolved, self.contribution)

    def selection(self, name: str) -> Selection:
        return next(s for s in self.selections if s.name == name)


def partition_rows(resolved: Resolved, contribution: Contribution) -> int:
    """More rows than any aggregate of the query adds up in one partition, decided
    from the query's shape and the bounds alone; the sums' overflow proofs (the
    plan's ``SUM_LIMIT``, Spark's choice of a BIGINT sum) and the counts' BIGINT rest
    on it.

    A query of one scan reads each row of its table at most once (the grammar has
    no set operation, table function or ``UNNEST``; a semi-join only filters), so
    fewer than ``MAX_ROWS``. A join can repeat a row (a unit's rows times a public
    table's matches), but every joined row extends a row of the first private scan
    (joins are inner or ``LEFT`` with the private table first), so fewer than
    ``MAX_ROWS`` units reach the aggregate, and bounding leaves each at most
    ``ranks.rows`` rows in a partition. The policy keeps that below
    ``policy.MAX_UNIT_ROWS``, so this is at most ``2^62``."""
    return MAX_ROWS if len(resolved.scans) == 1 else MAX_ROWS * contribution.rows


def keyed(keys: int) -> tuple[Callable[[Sequence], object], Callable[[tuple], object]]:
    """How a row's first ``keys`` values and a partition are compared: as the same
    tuple, or, for one key, as the value itself (equal exactly when the one-value
    tuples are, and a 100,000-row result is then matched without building a tuple a
    row: 90 → 30 ms)."""
    if keys == 1:
        return itemgetter(0), itemgetter(0)
    if keys == 0:
        return lambda row: (), tuple
    return itemgetter(*range(keys)), tuple


def grid_bounds(clamp: ValueRange, grid_exp: int) -> tuple[int, int]:
    """Integer bounds of a clamped value rounded to the grid: whichever way the SQL
    rounds a value in ``[lo, hi]``, it lands within ``[floor(lo), ceil(hi)]``."""
    step = 2.0**grid_exp
    return math.floor(clamp.lo / step), math.ceil(clamp.hi / step)
