"""Value bounds chosen privately: clip a sum's values where the data lies, not where
the policy's declared range ends.

A declared range must hold every value the domain allows: incomes in
``[0, 200000]``. Most values lie far inside it, but a sum's noise is calibrated to
the whole range, so an average over a skewed column is much noisier than it
needs to be. ``%%dpsql --clip SHARE`` (request field ``clip``) answers in two
releases, as Google's differential privacy library's ``ApproxBounds`` does:

1. **Bounds** (``ClipBounds``): with ``SHARE`` of the query's ε, a DP quantile
   (the exponential mechanism of ``dp/quantile_selection.py``, OpenDP's scores) of each
   summed argument at ``LEVELS`` over the query's rows (the same scans, joins,
   ``WHERE`` and contribution bounds, no ``GROUP BY``): ``bounds_checked`` makes
   that query from the checked one.
2. **The query** (``Clipped``), with the rest of the ε, each summed argument's
   interval cut to its noisy bounds (``clip_bounds``): the generated SQL clamps
   each value into them (the stored values lie in the declared range, wider), and
   the sensitivities, centres and intervals follow the narrower interval.

Privacy. The first release is ``SHARE·ε``-DP. For every fixed clip the second is
``(1 − SHARE)·ε``-DP: its SQL clamps every value into the clip, so the
sensitivity holds whatever the data. The clip is a function of the first release
alone (post-processing), so by adaptive composition the pair is ε-DP, each part
charged as a query of its own (the ledger shows both). Values outside the clip
are moved to its ends: a bias, traded for less noise, which the reply states
(the bounds chosen and the ε they took).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sqlglot import exp

from dpmagic.gate.failures import Refused, required
from dpmagic.gate.sql.bound import Bounded
from dpmagic.gate.sql.check import AggregateCall, Checked, Output
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.value_range import ValueRange

# The quantiles the bounds are chosen at: a fiftieth of the values is moved to each end.
LEVELS = (0.02, 0.98)
# Aggregates whose argument is summed, and whose noise therefore follows its range.
SUMMED = frozenset({"sum", "avg", "var_samp", "var_pop", "stddev_samp", "stddev_pop"})
PREFIX = "__clip"


@dataclass(frozen=True)
class ClipBounds:
    """The first release: the bounds of the query's summed arguments."""


@dataclass(frozen=True)
class Clipped:
    """The second release: each summed argument (by its canonical SQL) cut to
    ``(lower, upper)``."""

    clips: tuple[tuple[str, float, float], ...]

    def get(self, arg: exp.Expression) -> tuple[float, float] | None:
        text = arg.sql(dialect=DIALECT)
        return next(((lo, hi) for key, lo, hi in self.clips if key == text), None)


ClipStage = ClipBounds | Clipped


def targets(checked: Checked) -> list[AggregateCall]:
    """The query's summed aggregates, one per distinct argument."""
    seen: dict[str, AggregateCall] = {}
    for agg in checked.aggregates:
        if agg.func in SUMMED and agg.arg is not None:
            seen.setdefault(agg.arg.sql(dialect=DIALECT), agg)
    if not seen:
        raise Refused(
            "--clip chooses the bounds of the values a query sums (SUM, AVG, VAR, STDDEV): "
            "this query sums none"
        )
    return list(seen.values())


def bounds_checked(checked: Checked) -> Checked:
    """The first release's query: for each summed argument its quantiles at ``LEVELS``
    over the same rows, without groups, ``HAVING``, order or limit."""
    aggregates, outputs = [], []
    for agg in targets(checked):
        for side, level in zip(("lower", "upper"), LEVELS, strict=True):
            name = f"{PREFIX}{len(aggregates)}"
            label = f"{side} bound of {agg.label}"
            aggregates.append(AggregateCall(name, "quantile", agg.arg, label, level))
            outputs.append(Output(name=name, expr=exp.column(name)))
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


def clipped(checked: Checked, values: list[float]) -> Clipped:
    """The second release's clips from the first's released row (``bounds_checked``'s
    outputs in order: lower, upper, per summed argument); a pair drawn out of order
    is taken as the interval between them."""
    clips = []
    for i, agg in enumerate(targets(checked)):
        a, b = values[2 * i], values[2 * i + 1]
        clips.append((agg.arg.sql(dialect=DIALECT), min(a, b), max(a, b)))  # type: ignore[union-attr]
    return Clipped(tuple(clips))


def clip_bounded(bounded: Bounded, stage: ClipStage | None) -> Bounded:
    """The bound pass's intervals with each summed argument's cut to its clip: the pass
    between ``bound`` and ``plan`` of a clipped query (the identity otherwise)."""
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
