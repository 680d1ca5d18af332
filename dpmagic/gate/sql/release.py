"""Pass 9: post-processing on noisy values only.

The noisy vectors and the public keys are loaded into an empty in-memory
DuckDB and the query's ``SELECT`` list, ``HAVING``, ``ORDER BY`` and
``LIMIT`` are evaluated there, each DP aggregate replaced by its noisy value:
a count floored at zero, a sum as is, an average as noisy sum over noisy
count clamped into the value's bounds. Whatever this computes is
post-processing of DP outputs and costs no privacy.

The trees evaluated are ``post_query``'s; a plain SELECT of bare columns, counts
and averages skips DuckDB (``release_columns``).

Each released cell carries a 95% interval (``intervals``): the noise's own
interval for a single count or sum, calibrated intervals for an average
(Fieller's) and a variance, and interval arithmetic over the aggregates'
intervals (Bonferroni-adjusted, ``dp.levels``) for expressions of several. A quantile's interval
is made of two more selections (``edges``), at 95% only: under arithmetic that
needs it at a finer level its interval is unknown. It carries its rank radius
and its band of the group's percentiles too (``QuantileNoise.rank_radius``).
Each released column says whether noise dominates its cells (``dominance``).

Quantiles of one column in one group are released in order (``in_order``): a
25th percentile above the median it sits under reads as a finding, and is noise.
The noisy values are sorted by level, and each cell's interval (and band of
percentiles, ``dominance``) widened to hold the interval of the draw it now
shows: sorting reads released values only, so it is post-processing, and a
superset of an interval that held at 95% still does (docs/accuracy.md,
"Quantiles in order").

Aggregates over a randomized-response column are debiased first
(``randomized``): their values and their normal-approximation intervals,
which combine the randomization with the central noise, stand in for the raw
measurements'. Debiasing reads noisy values only, so it too is
post-processing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import duckdb
import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpmagic import wire
from dpmagic.gate.dp.levels import REPORT_ALPHA, expression_level
from dpmagic.gate.engines.dialect import DUCKDB
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.parts import Avg, DebiasedSum, Measured
from dpmagic.gate.sql.dominance import Origins, judged
from dpmagic.gate.sql.edges import edge_names
from dpmagic.gate.sql.intervals import CellIntervals
from dpmagic.gate.sql.noise import Noisy, Partition, declared_array
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.plan_types import Measurement, Plan, Selection
from dpmagic.gate.sql.post_query import PID, PostExpr, PostQuery, debiased_column, post_query
from dpmagic.gate.sql.randomized import Debiased, debias
from dpmagic.gate.sql.release_columns import Column, Columns, direct
from dpmagic.protocol import Accuracy, ColumnAccuracy, PartitionSelection, RandomizedResponse

ALPHA = REPORT_ALPHA
# An empty in-memory database that only ever sees noisy values; each release
# works in a connection of its own, whose registered table dies with it.
_POST_DB = duckdb.connect(config={"enable_external_access": False, "threads": 1})


@dataclass(frozen=True, eq=False)
class Released:
    """The released table: its values column by column, as JSON would carry them (numpy
    arrays where the noise pass made them, non-finite floats only in those), and its
    accuracy, whose per-cell intervals may be an ``(n, 2)`` array (NaN where JSON has
    null): ``dpmagic/wire.py`` writes either without a Python object per cell."""

    columns: list[str]
    values: wire.Columns
    cells_accuracy: Accuracy

    @property
    def rows(self) -> list[list[object]]:
        """The rows as the JSON reply carries them."""
        return self.values.rows

    @property
    def accuracy(self) -> dict[str, object]:
        """The accuracy as the JSON reply carries it (arrays as lists)."""
        reply = {"columns": self.columns, "accuracy": self.cells_accuracy.carried()}
        envelope, table = wire.split({**reply, "rows": self.values})
        return wire.merged(envelope, table)["accuracy"]

    def __eq__(self, other: object) -> bool:
        """Equal when the JSON replies are: the same columns, rows and accuracy."""
        if not isinstance(other, Released):
            return NotImplemented
        mine = (self.columns, self.rows, self.accuracy)
        return mine == (other.columns, other.rows, other.accuracy)

    __hash__ = None  # type: ignore[assignment]


def release(noisy: Noisy, alpha: float = ALPHA, made: PostQuery | None = None) -> Released:
    """The released table and its accuracy; ``made`` is the plan's ``post_query``
    when the caller kept it."""
    plan = noisy.plan
    checked = plan.checked
    noisy, origins = in_order(noisy)
    debiased = _debiased(plan, noisy)
    table = _noisy_columns(plan, noisy, debiased)
    post = PostExpr(plan, checked)
    made = made or post_query(plan)
    exprs = list(made.exprs)
    names = [PID, *(o.name for o in checked.outputs)]
    plain = checked.having is None and not checked.order and checked.limit is checked.offset is None
    vectors = direct(table, exprs) if plain else None
    if vectors is None:
        query = exp.select(
            *(exp.alias_(e.copy(), n, quoted=True) for e, n in zip(exprs, names, strict=True))
        ).from_("noisy")
        if made.having is not None:
            query = query.where(made.having.copy())
        if made.order:
            query = query.order_by(*(o.copy() for o in made.order))
        if checked.limit is not None:
            query = query.limit(checked.limit)
        if checked.offset is not None:
            query = query.offset(checked.offset)
        # pandas only here, for the few queries with HAVING, ORDER BY or LIMIT: its
        # frame holds any Python value DuckDB reads (integers past 64 bits among them),
        # and the gate does not load it (67 MB) for queries that never need it.
        import pandas as pd

        con = _POST_DB.cursor()
        try:
            con.register("noisy", pd.DataFrame(table))
            result = con.execute(DUCKDB.render(query)).fetchall()
        finally:
            con.close()
        vectors = list(zip(*result, strict=True)) if result else [() for _ in names]
    pids = cast(Sequence[int], vectors[0])  # the partition ids the post-query kept

    intervals = CellIntervals(plan, noisy, alpha, debiased)
    accuracy_columns: list[ColumnAccuracy | None] = []
    for out in checked.outputs:
        used = post.measurements_in(out.expr)
        if not used:
            accuracy_columns.append(None)
            continue
        parts = [_part(plan, n) for n in used]
        single = parts[0] if len(parts) == 1 else None
        bare = isinstance(out.expr, exp.Column) and isinstance(single, Selection)
        rank = _rank_accuracy(single, alpha) if bare and isinstance(single, Selection) else {}
        events = post.estimates_in(out.expr)
        pairs = intervals.cells(out.expr, pids, events)
        facts: dict[str, Any] = {
            **rank,
            "mechanism": single.noise.mechanism if single else "post-processing",
            "scale": single.scale if single else None,
            **_randomized_accuracy(plan, out.expr),
            "measurements": [p.label for p in parts],
            "intervals": pairs,
            **judged(plan, noisy, expression_level(alpha, events), out.expr, pids, pairs, origins),
        }
        accuracy_columns.append(ColumnAccuracy(**facts))
    accuracy = Accuracy(alpha=alpha, columns=accuracy_columns)
    if plan.key_selection is not None:
        # Which keys appear is itself a DP output: say how they were chosen.
        selection = plan.key_selection
        accuracy.partition_selection = PartitionSelection(
            mechanism=selection.mechanism,
            scale=selection.scale,
            threshold=selection.threshold,
            epsilon=selection.epsilon,
            delta=selection.delta,
        )
    return Released(
        columns=[o.name for o in checked.outputs],
        values=wire.Columns([_json_column(v) for v in vectors[1:]]),
        cells_accuracy=accuracy,
    )


def in_order(noisy: Noisy) -> tuple[Noisy, Origins]:
    """``noisy`` with the quantiles of each column released in order within each group,
    and, per quantile whose cells changed, the draws its cells now show (``Origins``).

    A column's quantiles are the query's quantile aggregates (MIN, MAX, MEDIAN,
    percentiles) of one argument over one grid; their true values are in the order of
    their levels in every group (the ``q``-quantile is the least candidate with at
    least ``q·n`` values at or below it: a larger ``q`` never asks for fewer). Where
    the noisy draws are not, they are sorted (a stable sort: tied draws keep their
    levels' order, and draws already in order stay as they are), which brings each
    closer to the truth, never farther, in any ``Lp`` norm (rearrangement,
    Chernozhukov, Fernández-Val and Galichon 2009). A cell whose draw came from
    another level's selection gets as its interval the hull of its own interval and
    that draw's: its own held its group's true quantile at 95%, a wider one does too,
    and the draw's interval holds the value shown whenever the draw's own did.
    Post-processing: only released values are read."""
    plan = noisy.plan
    quantiles = {
        parts.names[0]
        for name, parts in plan.parts.items()
        if plan.checked.aggregate(name).func is AggregateFunc.QUANTILE
    }
    columns: dict[tuple[object, ...], list[Selection]] = {}
    for s in plan.selections:
        if s.name in quantiles:
            key = (s.arg.sql(dialect=DIALECT), s.grid, s.edges is None)
            columns.setdefault(key, []).append(s)
    values = dict(noisy.values)
    origins: Origins = {}
    for members in columns.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda s: s.noise.level)
        draws = [list(values[s.name]) for s in members]
        order = np.argsort(np.asarray(draws, dtype=float), axis=0, kind="stable")
        if (order == np.arange(len(members))[:, None]).all():
            continue
        ends = [[list(values[n]) for n in edge_names(s.name)] for s in members if s.edges]
        for j, s in enumerate(members):
            came = order[j]
            values[s.name] = [draws[i][p] for p, i in enumerate(came.tolist())]
            if ends:
                low, high = edge_names(s.name)
                own_lo, own_hi = ends[j]
                values[low] = [min(own_lo[p], ends[i][0][p]) for p, i in enumerate(came.tolist())]
                values[high] = [max(own_hi[p], ends[i][1][p]) for p, i in enumerate(came.tolist())]
            origins[s.name] = (tuple(members), came)
    if not origins:
        return noisy, origins
    return Noisy(plan=plan, values=values, partitions=noisy.partitions), origins


def _rank_accuracy(selection: Selection, alpha: float) -> dict[str, float]:
    """The quantile level and its rank radius: public, from the plan alone."""
    return {
        "level": selection.noise.level,
        "rank_radius": selection.noise.rank_radius(alpha),
    }


def _randomized_accuracy(plan: Plan, node: exp.Expression) -> dict[str, object]:
    """A bare debiased aggregate names both its sources of error, and how its
    interval is made."""
    d = plan.debiased.get(node.name) if isinstance(node, exp.Column) else None
    if d is None:
        return {}
    first = plan.measurement(plan.parts[node.name].names[0])  # the count, sum or mean's sum
    return {
        "mechanism": f"randomized response + {first.noise.mechanism}",
        "scale": first.scale,
        "randomized_response": RandomizedResponse(p=d.p, values=d.k),
        "interval": "normal approximation",
    }


def _debiased(plan: Plan, noisy: Noisy) -> dict[str, Debiased]:
    """Each randomized-response aggregate debiased from its noisy measurements."""
    out = {}
    for name, d in plan.debiased.items():
        parts = plan.parts[name]
        groups = _groups_over(noisy.partitions, d.key) if d.key is not None else []
        if isinstance(parts, Avg | DebiasedSum):
            out[name] = debias(d, noisy.values[parts.total], noisy.values[parts.count], groups)
        elif isinstance(parts, Measured):
            out[name] = debias(d, noisy.values[parts.name], None, groups)
    return out


def _groups_over(partitions: tuple[Partition, ...], key: int) -> list[list[int]]:
    """Partitions grouped by every key but ``key``: each group holds one partition
    per value of ``key``, as the partitions are every combination of public keys
    (the plan refuses such a key beside keys chosen from the data)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for pid, partition in enumerate(partitions):
        groups.setdefault(partition[:key] + partition[key + 1 :], []).append(pid)
    return list(groups.values())


def _part(plan: Plan, name: str) -> Measurement | Selection:
    if name.startswith("q"):
        return plan.selection(name)
    return plan.measurement(name)


def _noisy_columns(plan: Plan, noisy: Noisy, debiased: dict[str, Debiased]) -> Columns:
    """The noisy table, column by column: the partition ids, the keys, the noisy
    measurements and the debiased aggregates."""
    data: Columns = {PID: np.arange(len(noisy.partitions))}
    for i, key in enumerate(plan.keys):
        data[key.name] = _key_column(plan, noisy, i)
    parts: tuple[Measurement | Selection, ...] = (*plan.measurements, *plan.selections)
    for m in parts:
        values = noisy.values[m.name]
        data[f"__{m.name}"] = values if isinstance(values, np.ndarray) else list(values)
    for name, d in debiased.items():
        data[debiased_column(name)] = list(d.values)
    return data


def _key_column(plan: Plan, noisy: Noisy, i: int) -> Sequence[object]:
    """Key ``i``'s value per partition: one integer key's declared values as the int64
    array the noise pass matched rows with (made once per plan, ``declared_array``),
    anything else as a list of the partitions' values."""
    if len(plan.keys) == 1 and noisy.partitions is plan.partitions:
        declared = declared_array(plan)
        if declared is not None and declared.type == pa.int64():
            return declared.to_numpy()
    return [p[i] for p in noisy.partitions]


def _json_column(column: Column) -> Column:
    """A released column with each value as JSON carries it; a column of integers, text,
    booleans and NULLs only is already so, and so is a numpy column (``wire`` writes
    a float array's non-finite values as null)."""
    if isinstance(column, np.ndarray) or set(map(type, column)) <= _JSON_READY:
        return column
    return [_json(v) for v in column]


_JSON_READY = frozenset({int, str, bool, type(None)})


def _json(value: object) -> object:
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value
