"""Pass 8: one noisy vector per measurement, over every released partition.

With public keys, partitions with no rows are released too (with exact
value 0 plus noise, or a quantile chosen from an empty histogram): the set
of released keys comes from the policy, never from the data. With private
keys, the released partitions are those the plan's noisy threshold keeps
(``partition_selection``), in key order, and every measurement is noised
over those only. A quantile's interval ends (``edges``) are chosen last, from
its histograms and its count's noisy values.

A centred sum (``plan_types.Centre``) is noised around its centre: its exact value,
in noise units, is computed here from the exact sum and the exact count of
its rows that the SQL returns, and only that value plus noise leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpmagic.gate.dp.levels import EDGE_PART_ALPHA
from dpmagic.gate.engines.interface import Batches, ExactResult
from dpmagic.gate.failures import required
from dpmagic.gate.sql.edges import edge_names, edge_values
from dpmagic.gate.sql.plan_types import Edges, Plan, Selection, keyed
from dpmagic.gate.sql.rewrite import KEY_COUNT, Rewritten

Partition = tuple[object, ...]
Vector = list[int | float] | np.ndarray
# Sums of two int64 vectors whose values are each below this in size cannot overflow.
_HALF = 2**62


@dataclass(frozen=True)
class Noisy:
    """Noisy values by measurement name, one per partition in ``partitions`` order.

    Counts and integer sums stay integers; fixed-point sums are scaled back to floats.
    A vector is a list, or, where the exact result came in columns (``columnar``), a
    numpy array (int64 or float64) holding the same values.
    """

    plan: Plan
    values: Mapping[str, Vector]
    partitions: tuple[Partition, ...]


def noise(plan: Plan, rewritten: Rewritten, exact: ExactResult) -> Noisy:
    if exact.table is not None:
        return _noised(plan, *_columnar_units(plan, rewritten, exact.table))
    rows = exact.rows
    partitions = plan.partitions
    if plan.key_selection is not None:
        # The threshold is drawn once per key: here, unless the fetch already did.
        if not exact.thresholded:
            rows = key_threshold(plan, rewritten)(rows)
        partitions = tuple(sorted({tuple(row[: rewritten.keys]) for row in rows}, key=_order))
    units, histograms = exact_vectors(plan, rewritten, rows, partitions)
    size = len(partitions)
    values: dict[str, list[int | float]] = {}  # lists: the exact result came in rows
    for s in plan.selections:
        values[s.name] = [s.grid.value(s.noise.select(h)) for h in histograms[s.name]]
    for m in plan.measurements:
        draws = m.noise.sample(size) if m.noise.sensitivity else [0] * size
        noisy: list[int | float] = [u + d for u, d in zip(units[m.name], draws, strict=True)]
        step = m.noise.granularity
        values[m.name] = noisy if step == 1.0 else [v * step for v in noisy]
    for s in plan.selections:
        if s.edges is not None:
            values.update(_edges(plan, s, s.edges, histograms[s.name], values))
    return Noisy(plan=plan, values=values, partitions=partitions)


# From this many released partitions on, the exact result is fetched in columns.
COLUMNAR_FROM = 512


def columnar(plan: Plan, rewritten: Rewritten) -> Batches | None:
    """How the exact result's record batches are reduced as they are fetched
    (``Database.run``'s ``batches``), where it is fetched in columns: from
    ``COLUMNAR_FROM`` released partitions on, a number public keys fix. Below it, a
    DuckDB cursor's Arrow reader and the vectors it feeds cost more than the rows
    (1M rows in process, each way in turn: 50 groups 4.1 ms by rows against 4.8 in
    columns, 300 groups 6.7 against 7.2, 1,000 groups 9.1 against 8.7, 10,000 groups
    71 against 21). None: fetch rows."""
    if len(plan.partitions) < COLUMNAR_FROM:
        return None
    return batch_reducer(plan, rewritten)


def batch_reducer(plan: Plan, rewritten: Rewritten) -> Batches | None:
    """How record batches are reduced as they are fetched, when the query can be noised
    column by column: public keys (or none), at most one, no histogram or debiased
    aggregate (those go row by row). A key whose declared values are all of one type
    Arrow holds exactly (int64, text, boolean), and whose column the SQL returns as
    that type, is tested with Arrow's hash lookup; any other key by Python's equality,
    as the rows path tests it (``declared_keys``), so a row is kept exactly when it is
    kept there. None: the query goes by rows."""
    if plan.key_selection is not None or plan.selections or plan.debiased:
        return None
    if rewritten.keys == 0:
        return lambda batch: batch
    if rewritten.keys > 1:
        return None

    def keep(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.filter(_partition_index(plan, batch.column(0)) >= 0)

    return keep


def _noised(plan: Plan, units: dict[str, Vector], partitions: tuple[Partition, ...]) -> Noisy:
    """Each measurement's exact vector plus its noise, in int64 arrays where no value can
    pass 2**63 (``_HALF``), else in Python integers: the same sums either way."""
    size = len(partitions)
    values: dict[str, Vector] = {}
    for m in plan.measurements:
        exact = units[m.name]
        draws = m.noise.sample_array(size) if m.noise.sensitivity else np.zeros(size, np.int64)
        if isinstance(exact, np.ndarray) and _small(exact) and _small(draws):
            noisy: Vector = exact + draws
        else:
            noisy = [int(u) + int(d) for u, d in zip(exact, draws.tolist(), strict=True)]
        step = m.noise.granularity
        if step != 1.0:
            noisy = noisy * step if isinstance(noisy, np.ndarray) else [v * step for v in noisy]
        values[m.name] = noisy
    return Noisy(plan=plan, values=values, partitions=partitions)


def _columnar_units(
    plan: Plan, rewritten: Rewritten, table: pa.Table
) -> tuple[dict[str, Vector], tuple[Partition, ...]]:
    """``exact_vectors`` for a result fetched in columns (``columnar``): each
    measurement's exact vector over the plan's partitions, 0 where no row is (a NULL
    too), as int64 arrays, or Python integers where a value is beyond 64 bits."""
    partitions = plan.partitions
    size = len(partitions)
    if rewritten.keys:
        at = _partition_index(plan, table.column(0))
    else:
        at = np.zeros(table.num_rows, dtype=np.int64)
    found = at >= 0
    at = at[found]
    sums: dict[str, Vector] = {}
    for column, name in enumerate(rewritten.measurements, start=rewritten.keys):
        values = table.column(column).filter(pa.array(found)).fill_null(0)
        try:
            exact = values.cast(pa.int64()).to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # beyond 64 bits
            wide: list[int | float] = [0] * size
            for i, v in zip(at.tolist(), values.to_pylist(), strict=True):
                wide[i] = int(v)
            sums[name] = wide
            continue
        vector = np.zeros(size, dtype=np.int64)
        vector[at] = exact
        sums[name] = vector
    return _centred_units(plan, sums), partitions


def _centred_units(plan: Plan, sums: dict[str, Vector]) -> dict[str, Vector]:
    """``exact_units`` over arrays: ``per_grid·S − units·N`` in int64 where it cannot
    overflow, else in Python integers."""
    out = dict(sums)
    for m in plan.measurements:
        c = m.centre
        if c is None:
            continue
        s, n = sums[m.name], sums[c.count]
        if isinstance(s, np.ndarray) and isinstance(n, np.ndarray):
            largest = abs(c.per_grid) * _largest(s) + abs(c.units) * _largest(n)
            if largest < _HALF:
                out[m.name] = c.per_grid * s - c.units * n
                continue
        out[m.name] = [c.per_grid * int(a) - c.units * int(b) for a, b in zip(s, n, strict=True)]
    return out


def _largest(vector: np.ndarray) -> int:
    return int(np.abs(vector).max()) if vector.size else 0


def _small(vector: np.ndarray) -> bool:
    return vector.dtype == np.int64 and _largest(vector) < _HALF


# Each plan's declared key values as one Arrow array, for the plans seen last (a plan
# is a function of its query and policy, kept by the analysis cache: built once).
_DECLARED: dict[int, tuple[Plan, pa.Array | None]] = {}
_DECLARED_KEPT = 64
_ARROW_KEYS = {int: pa.int64(), str: pa.string(), bool: pa.bool_()}


def declared_array(plan: Plan) -> pa.Array | None:
    """The one key's declared values, in the partitions' order, as an Arrow array of
    one exact type; None when they are not all of one such type or not all distinct."""
    kept = _DECLARED.get(id(plan))
    if kept is not None and kept[0] is plan:
        return kept[1]
    values = [p[0] for p in plan.partitions]
    kinds = set(map(type, values))
    array = None
    if len(kinds) == 1 and (arrow := _ARROW_KEYS.get(kinds.pop())) is not None:
        try:
            array = pa.array(values, type=arrow)
        except (OverflowError, pa.ArrowInvalid):  # an integer beyond 64 bits
            array = None
        if array is not None and len(pc.unique(array)) != len(array):
            array = None
    if len(_DECLARED) >= _DECLARED_KEPT:
        _DECLARED.clear()
    _DECLARED[id(plan)] = (plan, array)
    return array


def _partition_index(plan: Plan, keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each row's partition, −1 for a key nobody declared: Arrow's hash lookup where the
    key column has the declared values' type (integers of any width as int64, text),
    else Python's equality on each value, as ``exact_vectors`` matches rows."""
    declared = declared_array(plan)
    if declared is not None and _same_kind(keys.type, declared.type):
        cast = keys.cast(declared.type)
        return pc.index_in(cast, value_set=declared).fill_null(-1).to_numpy().astype(np.int64)
    index = {p[0]: i for i, p in enumerate(plan.partitions)}
    return np.fromiter((index.get(v, -1) for v in keys.to_pylist()), np.int64, len(keys))


def _same_kind(column: pa.DataType, declared: pa.DataType) -> bool:
    if pa.types.is_integer(declared):
        return pa.types.is_integer(column) and not (
            pa.types.is_uint64(column)  # beyond int64: Python's equality
        )
    if pa.types.is_string(declared):
        return pa.types.is_string(column) or pa.types.is_large_string(column)
    return column == declared


def _edges(
    plan: Plan,
    s: Selection,
    edges: Edges,
    histograms: list[dict],
    values: dict[str, list[int | float]],
) -> dict[str, list[int | float]]:
    """A quantile's interval ends per partition (``edges``), from its histograms and
    its count's noisy values."""
    count = plan.measurement(edges.count)
    half = count.noise.half_width(EDGE_PART_ALPHA) if count.noise.sensitivity else 0.0
    lows, highs = edge_values(
        s.noise.level, s.grid.size, s.noise.distance, edges.epsilon,
        histograms, values[count.name], half, s.grid.value,
    )  # fmt: skip
    low, high = edge_names(s.name)
    return {low: lows, high: highs}


def exact_vectors(
    plan: Plan, rewritten: Rewritten, rows: list[tuple], partitions: tuple[Partition, ...]
) -> tuple[dict[str, list[int]], dict[str, list[dict]]]:
    """The exact values the noise is added to, per partition of ``partitions``: each
    measurement's in its noise's units (``exact_units``), each selection's histogram.
    A row of no partition there is left out (the SQL keeps declared keys only;
    nothing else is released); a partition with no row is 0, or an empty histogram."""
    row_key, partition_key = keyed(rewritten.keys)
    index = {partition_key(partition): i for i, partition in enumerate(partitions)}
    size = len(partitions)
    units = {m.name: [0] * size for m in plan.measurements}
    histograms: dict[str, list[dict]] = {s.name: [{} for _ in range(size)] for s in plan.selections}
    at = [(i, row) for row in rows if (i := index.get(row_key(row))) is not None]
    for column, name in enumerate(rewritten.measurements, start=rewritten.keys):
        if name in histograms:
            for i, row in at:
                histograms[name][i] = dict(row[column] or {})
        elif name in units:
            vector = units[name]
            for i, row in at:
                vector[i] = int(row[column] or 0)
    return exact_units(plan, units), histograms


def exact_units(plan: Plan, sums: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each measurement's exact vector in its noise's units, from the exact vectors the
    SQL returns: a centred sum is ``per_grid·S − units·N`` per partition, for its sum
    ``S`` (in grid units) and the count ``N`` of the rows it adds up; the others are
    as returned. Exact integer arithmetic: nothing is rounded before the noise."""
    out = dict(sums)
    for m in plan.measurements:
        c = m.centre
        if c is not None:
            counts = sums[c.count]
            out[m.name] = [
                c.per_grid * s - c.units * n for s, n in zip(sums[m.name], counts, strict=True)
            ]
    return out


def declared_keys(plan: Plan, rewritten: Rewritten) -> Callable[[list[tuple]], list[tuple]]:
    """The rows whose key is declared, on each batch as the exact result is fetched:
    with ``Plan.listed_at_fetch`` the SQL returns every key it finds, and only the
    declared ones are held."""
    row_key, _ = keyed(rewritten.keys)
    declared = plan.declared_keys

    def keep(rows: list[tuple]) -> list[tuple]:
        return [row for row in rows if row_key(row) in declared]

    return keep


def key_threshold(plan: Plan, rewritten: Rewritten) -> Callable[[list[tuple]], list[tuple]]:
    """The rows whose key passes the plan's noisy threshold, drawn once per row: run on
    each batch as the exact result is fetched, so that only kept keys are held. The
    released keys are then sorted (a function of the released set alone, never of
    the data's row order)."""
    selection = required(plan.key_selection, "the plan's partition selection")
    column = rewritten.keys + rewritten.measurements.index(KEY_COUNT)

    def keep(rows: list[tuple]) -> list[tuple]:
        passes = selection.keep([int(row[column]) for row in rows])
        return [row for row, k in zip(rows, passes, strict=True) if k]

    return keep


def _order(partition: Partition) -> tuple:
    """Keys sort by type name first, so a column that mixes types still sorts."""
    return tuple((type(v).__name__, v) for v in partition)
