"""The fixed query sets: the same SQL for every tool, with how to score its answer.

Two workloads: ``bench`` (``run.py``: float income, persons with 1 to 5 visits, a
person table for the join) and ``visits`` (``visits.py``: integer income, three
visits per person). ``Workload`` says what the peers need to answer them under the
same bounds as the gate."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Query:
    name: str
    sql: str
    keys: tuple[str, ...]  # group-key columns, to match noisy rows to exact ones
    value: str  # the released column the error is measured on


COUNT_BY_STATE = Query(
    "count by state", "SELECT state, COUNT(*) AS n FROM visits GROUP BY state", ("state",), "n"
)
AVG_BY_DIAGNOSIS = Query(
    "avg income by diagnosis",
    "SELECT diagnosis, AVG(income) AS avg_income FROM visits GROUP BY diagnosis",
    ("diagnosis",),
    "avg_income",
)
COUNT_BY_STATE_DIAGNOSIS = Query(
    "count by state × diagnosis",
    "SELECT state, diagnosis, COUNT(*) AS n FROM visits GROUP BY state, diagnosis",
    ("state", "diagnosis"),
    "n",
)


def _sum_over_65(name: str) -> Query:
    return Query(name, "SELECT SUM(income) AS total FROM visits WHERE age > 65", (), "total")


QUERIES = (
    Query("total count", "SELECT COUNT(*) AS n FROM visits", (), "n"),
    COUNT_BY_STATE,
    AVG_BY_DIAGNOSIS,
    _sum_over_65("sum income, age > 65"),
    COUNT_BY_STATE_DIAGNOSIS,
    Query(
        "join: count by sex",
        "SELECT p.sex, COUNT(*) AS n FROM visits AS v JOIN persons AS p ON v.pid = p.pid "
        "GROUP BY p.sex",
        ("sex",),
        "n",
    ),
    Query(
        "median income", "SELECT MEDIAN(income) AS median_income FROM visits", (), "median_income"
    ),
)
# The visits workload's set, as the speed goal names its queries.
VISITS_QUERIES = (
    COUNT_BY_STATE,
    AVG_BY_DIAGNOSIS,
    _sum_over_65("sum income where age > 65"),
    COUNT_BY_STATE_DIAGNOSIS,
)


@dataclass(frozen=True)
class Workload:
    """A query set and the facts a peer is configured with to answer it: the privacy
    unit's column, the rows it keeps per unit, and income's type and bounds."""

    name: str
    queries: tuple[Query, ...]
    unit: str
    max_rows: int
    income_type: str  # "int" or "float"
    income_upper: float
    key_type: str  # the group keys' type: "int" or "string"


WORKLOADS = {
    "bench": Workload("bench", QUERIES, "pid", 5, "float", 500_000.0, "int"),
    # The gate's policy lets a person add 3 rows to each of at most 3 partitions: the
    # peers, which bound only a person's rows, are given that reach, 9 rows (a grouped
    # count's noise is then the same; an ungrouped query's partition is one, where
    # the gate counts on 3 rows and the peers on 9).
    "visits": Workload("visits", VISITS_QUERIES, "person_id", 9, "int", 200_000.0, "string"),
}


def indexed(q: Query, rows: list[list]) -> dict[tuple, float]:
    """A tool's answer rows as {group key: value}, rows without a value left out."""
    k = len(q.keys)
    return {tuple(r[:k]): float(r[k]) for r in rows if r[k] is not None}


def relative_error(exact: dict[tuple, float], noisy: dict[tuple, float]) -> float:
    """Mean over the exact answer's cells of |noisy - exact| / max(|exact|, 1); a cell
    the tool did not release counts as a full error (1.0)."""
    errors = []
    for key, truth in exact.items():
        got = noisy.get(key)
        if got is None or got != got:  # missing or NaN
            errors.append(1.0)
        else:
            errors.append(abs(got - truth) / max(abs(truth), 1.0))
    return sum(errors) / len(errors)
