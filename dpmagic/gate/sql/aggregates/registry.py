"""The catalogue's one table: the kind of each SQL node type the gate releases. The
check pass refuses an aggregate node whose type is not here, so a function is never
planned as a look-alike of another; ``tests/unit/test_aggregate_catalogue.py`` runs
every entry through the gate and checks its release against the engine's own result.
Adding a kind: its module, one line here, one row in docs/sql.md. A function sqlglot
has no node for is registered by its name (``parse.NAMED_AGGREGATES``, which makes
its calls sqlglot's ``AnonymousAggFunc``)."""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.sql.aggregates import (
    average,
    count,
    count_if,
    quantile,
    sums,
    trimmed_mean,
    variance,
)
from dpmagic.gate.sql.aggregates.base import Kind
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.parse import NAMED_AGGREGATES

CATALOGUE: dict[type[exp.Expression] | str, Kind] = {
    exp.Count: count.COUNT,
    exp.CountIf: count_if.COUNT_IF,
    exp.Sum: sums.SUM,
    exp.Avg: average.AVG,
    exp.Variance: variance.VAR_SAMP,
    exp.VariancePop: variance.VAR_POP,
    exp.Stddev: variance.STDDEV_SAMP,
    exp.StddevSamp: variance.STDDEV_SAMP,
    exp.StddevPop: variance.STDDEV_POP,
    exp.Min: quantile.QUANTILE,
    exp.Max: quantile.QUANTILE,
    exp.Median: quantile.QUANTILE,
    exp.PercentileCont: quantile.QUANTILE,
    exp.PercentileDisc: quantile.QUANTILE,
    exp.Quantile: quantile.QUANTILE,
    "TRIMMED_MEAN": trimmed_mean.TRIMMED_MEAN,
}


def kind_of_call(node: exp.Expression) -> Kind | None:
    """The kind of the aggregate call ``node``: by its exact node type, or by its name
    for a function sqlglot has no node for; None where the table has none."""
    if isinstance(node, exp.AnonymousAggFunc):
        return CATALOGUE.get(node.name.upper())
    return CATALOGUE.get(type(node))


def call_argument(node: exp.Expression) -> exp.Expression | None:
    """The argument an aggregate call ``node`` aggregates: its first."""
    if isinstance(node, exp.AnonymousAggFunc):
        return node.expressions[0] if node.expressions else None
    return node.this


def _by_func() -> dict[AggregateFunc, Kind]:
    """Each function's kind, from the table (with what ``DISTINCT`` makes of each);
    every function of ``AggregateFunc`` must be one entry's, or the gate does not start."""
    found: dict[AggregateFunc, Kind] = {}
    for kind in CATALOGUE.values():
        for k in (kind, kind.distinct):
            if k is not None:
                found.setdefault(k.func, k)
    missing = set(AggregateFunc) - set(found)
    if missing:
        raise RuntimeError(f"aggregate functions no catalogue entry plans: {sorted(missing)}")
    return found


_KINDS = _by_func()
if {k for k in CATALOGUE if isinstance(k, str)} != NAMED_AGGREGATES:
    raise RuntimeError("the catalogue's names and parse.NAMED_AGGREGATES differ")


def kind_of(func: AggregateFunc) -> Kind:
    """The kind that plans aggregates of ``func``."""
    return _KINDS[func]
