"""Pass 8: one noisy vector per measurement, over every released partition.

Partitions with no rows are released too (with exact value 0 plus noise, or
a quantile chosen from an empty histogram): the set of released keys comes
from the policy, never from the data.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmagic.gate.sql.execute import ExactResult
from dpmagic.gate.sql.plan import Plan
from dpmagic.gate.sql.rewrite import Rewritten


@dataclass(frozen=True)
class Noisy:
    """Noisy values by measurement name, one per partition in ``plan.partitions`` order.

    Counts and integer sums stay integers; fixed-point sums are scaled back to floats.
    """

    plan: Plan
    values: dict[str, list[int | float]]


def noise(plan: Plan, rewritten: Rewritten, exact: ExactResult) -> Noisy:
    index = {partition: i for i, partition in enumerate(plan.partitions)}
    size = len(plan.partitions)
    units = {m.name: [0] * size for m in plan.measurements}
    histograms: dict[str, list[dict]] = {s.name: [{} for _ in range(size)] for s in plan.selections}
    for row in exact.rows:
        i = index.get(tuple(row[: rewritten.keys]))
        if i is None:  # the SQL keeps declared keys only; nothing else is released
            continue
        for name, value in zip(rewritten.measurements, row[rewritten.keys :], strict=True):
            if name in histograms:
                histograms[name][i] = dict(value or {})
            else:
                units[name][i] = int(value or 0)
    values: dict[str, list[int | float]] = {}
    for s in plan.selections:
        values[s.name] = [s.grid.value(s.noise.select(h)) for h in histograms[s.name]]
    for m in plan.measurements:
        draws = m.noise.sample(size) if m.noise.sensitivity else [0] * size
        noisy = [u + d for u, d in zip(units[m.name], draws, strict=True)]
        step = m.noise.granularity
        values[m.name] = noisy if step == 1.0 else [v * step for v in noisy]
    return Noisy(plan=plan, values=values)
