"""The bounding report's accuracy and cost, on a real engine over real DuckDB.

    python benchmarks/bounding_report.py                # 100k rows, 2,000 runs
    python benchmarks/bounding_report.py --runs 200     # quicker

A visits table of about 100,000 rows whose persons have 1 to 9 rows each (the
number drawn per person by a hash), policy ``max_partitions = 3``,
``max_rows_per_partition = 3``: an ungrouped query keeps each person's first 3
rows and leaves the rest out; a query grouped by state (one state per person)
keeps up to 9, so nothing is left out. Each query runs ``--runs`` times at
ε = 1 with ``--bounding-report 0.1`` and as many times without, in the gate's
``Engine`` (in process: no HTTP), and the table gives, for the report's rows
and units counts, the exact value (computed by DuckDB on the raw table), the
mean, RMSE and 95% interval coverage of the noisy report; the query's own
RMSE (of its cells' total) with and without the report (its share of ε shrinks
to 0.9); and the
median time of a query with and without it. Not a test: printed with the
machine's load.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb

PERSONS = 20_000
SHARE = 0.1
QUERIES = {
    "count (each person's first 3 rows)": ("SELECT COUNT(*) AS n FROM visits", 3),
    "count by state (first 9 rows)": ("SELECT state, COUNT(*) AS n FROM visits GROUP BY state", 9),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs per query and setting")
    args = parser.parse_args(argv)
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.policy import load_policy

    print(f"load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        truth = _data(folder / "visits.duckdb")
        (folder / "policy.toml").write_text(_policy(folder))
        engine = Engine(load_policy(folder / "policy.toml"))
        try:
            rows = [_measure(engine, name, sql, keep, truth, args.runs)
                    for name, (sql, keep) in QUERIES.items()]  # fmt: skip
        finally:
            engine.close()
    print(f"{truth['rows']:,} rows of {PERSONS:,} persons; ε = 1, report share {SHARE}, "
          f"{args.runs:,} runs each\n")  # fmt: skip
    print(
        "| query | left out: rows (exact) | mean | RMSE | 95% coverage | persons (exact) | mean "
        "| RMSE | 95% coverage | query RMSE without / with | median time without / with |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


def _data(path: Path) -> dict[str, object]:
    """The table, and what DuckDB says on the raw rows: per person the rows beyond 3."""
    con = duckdb.connect(str(path))
    con.execute(
        f"""
        CREATE TABLE visits AS
        SELECT p AS person_id,
               'S' || CAST(hash(p, 3) % 50 AS VARCHAR) AS state,
               CAST(hash(p, i, 1) % 101 AS INTEGER) AS age
        FROM range({PERSONS}) AS a(p), range(9) AS b(i)
        WHERE i < 1 + hash(p, 7) % 9
        """
    )
    (rows,) = con.execute("SELECT COUNT(*) FROM visits").fetchone()
    per = con.execute("SELECT COUNT(*) FROM visits GROUP BY person_id").fetchall()
    con.close()
    counts = [n for (n,) in per]
    return {"rows": rows, "counts": counts}


def _policy(folder: Path) -> str:
    states = [f"S{i}" for i in range(50)]
    return f"""
[gate]
state_dir = "{folder / "state"}"
response_quantum_ms = 0

[datasets.visits]
database = "{folder / "visits.duckdb"}"
privacy_unit = "person_id"
max_partitions = 3
max_rows_per_partition = 3
user_budget = {{ epsilon = 1e12 }}
notebook_budget = {{ epsilon = 1e12 }}

[datasets.visits.tables.visits.columns]
person_id = {{ type = "int" }}
state = {{ type = "str", public_values = {states} }}
age = {{ type = "int", lower = 0, upper = 100 }}
"""


def _measure(engine, name: str, sql: str, keep: int, truth: dict, runs: int) -> str:
    counts = truth["counts"]
    cap = 9
    exact_rows = sum(min(max(n - keep, 0), cap) for n in counts)
    exact_units = sum(1 for n in counts if n > keep)
    exact_total = sum(min(n, keep) for n in counts)  # what the query itself counts
    body = {"sql": sql, "epsilon": 1.0, "fresh": True, "notebook": "bench"}
    report_values: dict[str, list[float]] = {"rows": [], "units": []}
    covered = {"rows": 0, "units": 0}
    errors: dict[bool, list[float]] = {False: [], True: []}
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(runs):
        for with_report in (False, True):
            asked = {**body, "bounding_report": SHARE} if with_report else body
            start = time.perf_counter()
            reply = engine.query("bench", asked)
            times[with_report].append(time.perf_counter() - start)
            total = sum(row[-1] for row in reply["rows"])
            errors[with_report].append(total - exact_total)
            if with_report:
                left = reply["bounding"]["left_out"]
                for key, exact in (("rows", exact_rows), ("units", exact_units)):
                    value, (lo, hi) = left[key]["value"], left[key]["interval"]
                    report_values[key].append(value - exact)
                    covered[key] += lo <= exact <= hi

    def rmse(errs: list[float]) -> float:
        return math.sqrt(statistics.fmean(e * e for e in errs))

    cells = [name]
    for key, exact in (("rows", exact_rows), ("units", exact_units)):
        errs = report_values[key]
        cells += [f"{exact:,}", f"{exact + statistics.fmean(errs):,.1f}", f"{rmse(errs):.1f}",
                  f"{covered[key] / runs:.1%}"]  # fmt: skip
    cells.append(f"{rmse(errors[False]):.1f} / {rmse(errors[True]):.1f}")
    cells.append(
        f"{statistics.median(times[False]) * 1000:.1f} / "
        f"{statistics.median(times[True]) * 1000:.1f} ms"
    )
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    raise SystemExit(main())
