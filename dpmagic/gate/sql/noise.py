"""Pass 8: one noisy vector per measurement, over every released partition.

With public keys, partitions with no rows are released too (with exact
value 0 plus noise, or a quantile chosen from an empty histogram): the set
of released keys comes from the policy, never from the data. With private
keys, the released partitions are those the plan's noisy threshold keeps
(``partition_selection``), in key order, and every measurement is noised
over those only. A quantile's interval ends (``edges``) are chosen last, from
its histograms and its count's noisy values.

A centred sum (``plan.Centre``) is noised around its centre: its exact value,
in noise units, is computed here from the exact sum and the exact count of
its rows that the SQL returns, and only that value plus noise leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpmagic.gate.calibration import REPORT_ALPHA
from dpmagic.gate.errors import required
from dpmagic.gate.sql.edges import edge_names, edge_values
from dpmagic.gate.sql.execute import ExactResult
from dpmagic.gate.sql.plan import Edges, Plan, Selection, keyed
from dpmagic.gate.sql.rewrite import KEY_COUNT, Rewritten

Partition = tuple[object, ...]


@dataclass(frozen=True)
class Noisy:
    """Noisy values by measurement name, one per partition in ``partitions`` order.

    Counts and integer sums stay integers; fixed-point sums are scaled back to floats.
    """

    plan: Plan
    values: dict[str, list[int | float]]
    partitions: tuple[Partition, ...]


def noise(plan: Plan, rewritten: Rewritten, exact: ExactResult) -> Noisy:
    rows = exact.rows
    partitions = plan.partitions
    if plan.key_selection is not None:
        # The threshold is drawn once per key: here, unless the fetch already did.
        if not exact.thresholded:
            rows = key_threshold(plan, rewritten)(rows)
        partitions = tuple(sorted({tuple(row[: rewritten.keys]) for row in rows}, key=_order))
    units, histograms = exact_vectors(plan, rewritten, rows, partitions)
    size = len(partitions)
    values: dict[str, list[int | float]] = {}
    for s in plan.selections:
        values[s.name] = [s.grid.value(s.noise.select(h)) for h in histograms[s.name]]
    for m in plan.measurements:
        draws = m.noise.sample(size) if m.noise.sensitivity else [0] * size
        noisy = [u + d for u, d in zip(units[m.name], draws, strict=True)]
        step = m.noise.granularity
        values[m.name] = noisy if step == 1.0 else [v * step for v in noisy]
    for s in plan.selections:
        if s.edges is not None:
            values.update(_edges(plan, s, s.edges, histograms[s.name], values))
    return Noisy(plan=plan, values=values, partitions=partitions)


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
    half = count.noise.half_width(REPORT_ALPHA / 3) if count.noise.sensitivity else 0.0
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
    fused = {f.sum: f for f in rewritten.fused}
    for column, name in enumerate(rewritten.measurements, start=rewritten.keys):
        if name in histograms:
            for i, row in at:
                histograms[name][i] = dict(row[column] or {})
        elif name in fused:  # S·2^bits + N, with 0 ≤ N < 2^bits (``rewrite.Fused``)
            sums, counts, unit = units[name], units[fused[name].count], 1 << fused[name].bits
            for i, row in at:
                sums[i], counts[i] = divmod(int(row[column] or 0), unit)
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
