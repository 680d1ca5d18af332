"""What an aggregate computes, as a type: the check pass names each aggregate call's
function with one of these (``registry`` decides which from its SQL node), and every
later pass finds its kind by it (``registry.kind_of``); the registry refuses to load
unless every function here is one kind's."""

from __future__ import annotations

from enum import StrEnum


class AggregateFunc(StrEnum):
    """An aggregate function the gate releases. The values are the names the gate's
    plans and replies have always used, so fixtures and logs read the same."""

    COUNT = "count"
    COUNT_DISTINCT = "count_distinct"
    SUM = "sum"
    AVG = "avg"
    VAR_SAMP = "var_samp"
    VAR_POP = "var_pop"
    STDDEV_SAMP = "stddev_samp"
    STDDEV_POP = "stddev_pop"
    QUANTILE = "quantile"  # MIN, MAX, MEDIAN and percentiles: a quantile at a level
    TRIMMED_MEAN = "trimmed_mean"
