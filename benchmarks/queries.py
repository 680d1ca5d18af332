"""The fixed query set: the same SQL for every tool, with how to score its answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Query:
    name: str
    sql: str
    keys: tuple[str, ...]  # group-key columns, to match noisy rows to exact ones
    value: str  # the released column the error is measured on


QUERIES = (
    Query("total count", "SELECT COUNT(*) AS n FROM visits", (), "n"),
    Query(
        "count by state",
        "SELECT state, COUNT(*) AS n FROM visits GROUP BY state",
        ("state",),
        "n",
    ),
    Query(
        "avg income by diagnosis",
        "SELECT diagnosis, AVG(income) AS avg_income FROM visits GROUP BY diagnosis",
        ("diagnosis",),
        "avg_income",
    ),
    Query(
        "sum income, age > 65",
        "SELECT SUM(income) AS total FROM visits WHERE age > 65",
        (),
        "total",
    ),
    Query(
        "count by state × diagnosis",
        "SELECT state, diagnosis, COUNT(*) AS n FROM visits GROUP BY state, diagnosis",
        ("state", "diagnosis"),
        "n",
    ),
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
