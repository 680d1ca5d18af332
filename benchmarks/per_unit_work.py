"""How much time one unit can add to a query: the bound behind "after the debit,
only the timeout can fail, and one unit cannot move a query across it".

A unit's rows are cut at load to ``max_partitions × max_rows_per_partition``
(the load cap) and each text value to its column's ``max_length`` characters,
so the work any row expression does on one unit is at most the load cap times
the work on one row of the longest text. This script builds D (``--units``
ordinary units, one short row each) and D + the target (a unit with the load
cap's rows, each text at ``max_length`` characters), runs text-heavy and
numeric queries through the gate's engine in-process on both (padding off,
noise on), and prints median times, the difference the target makes, and
that difference as a share of the policy's ``query_timeout_s``.

    python benchmarks/per_unit_work.py                 # the policy's defaults
    python benchmarks/per_unit_work.py --max-length 1000000 --rows-per-unit 100

Not a test: timings depend on the machine (its load is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb

from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import DEFAULT_MAX_LENGTH, load_policy

QUERIES = {
    "ILIKE with wildcards": "SELECT COUNT(*) FROM t WHERE s ILIKE '%a%b%z%'",
    "nested text functions": (
        "SELECT COUNT(*) FROM t WHERE LENGTH(UPPER(LOWER(s || s)) || TRIM(s)) > 3"
    ),
    "grouped by a text key": ("SELECT k, COUNT(*) FROM t WHERE UPPER(s) LIKE '%Q%' GROUP BY k"),
    "arithmetic under TRY": "SELECT SUM(LEAST(GREATEST(x * x * x, 0), 1000)) FROM t",
}

POLICY = """
[gate]
state_dir = "{state}"

[datasets.d]
database = "{db}"
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = {rows}
user_budget = {{ epsilon = 1e9 }}
notebook_budget = {{ epsilon = 1e9 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
x = {{ type = "int" }}
k = {{ type = "str", public_values = ["a", "b", "c"] }}
s = {{ type = "str", max_length = {length} }}
"""


def _engine(folder: Path, units: int, rows: int, length: int, target: bool) -> Engine:
    name = "with" if target else "without"
    db = folder / f"{name}.duckdb"
    con = duckdb.connect(str(db))
    con.execute(
        "CREATE TABLE t AS SELECT range AS pid, range % 1000 AS x, "
        "['a', 'b', 'c'][range % 3 + 1] AS k, 'ab' AS s FROM range(?)",
        [units],
    )
    if target:  # the most a unit can keep: the load cap's rows, each text at max_length
        con.execute(
            "INSERT INTO t SELECT -1, 9223372036854775807, 'a', repeat('ab', ?) FROM range(?)",
            [(length + 1) // 2, rows],
        )
    con.close()
    policy = folder / f"{name}.toml"
    policy.write_text(
        POLICY.format(state=folder / f"state-{name}", db=db, rows=rows, length=length)
    )
    return Engine(load_policy(policy))


def _median_ms(engine: Engine, sql: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        engine.query("bench", {"sql": sql, "epsilon": 1.0, "fresh": True})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--rows-per-unit", type=int, default=10, help="the load cap")
    parser.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(
        f"{args.units:,} units; the target keeps {args.rows_per_unit} rows of "
        f"{args.max_length:,} characters; median of {args.reps}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        engines = {
            target: _engine(folder, args.units, args.rows_per_unit, args.max_length, target)
            for target in (False, True)
        }
        timeout = engines[True].policy.gate.query_timeout_s
        print(
            f"| query | without (ms) | with (ms) | difference (ms) | of the {timeout:g} s timeout |"
        )
        print("|---|---|---|---|---|")
        for label, sql in QUERIES.items():
            without = _median_ms(engines[False], sql, args.reps)
            with_it = _median_ms(engines[True], sql, args.reps)
            diff = with_it - without
            print(
                f"| {label} | {without:.1f} | {with_it:.1f} | {diff:+.1f} | "
                f"{diff / (timeout * 1000):.2%} |"
            )
        for e in engines.values():
            e.close()


if __name__ == "__main__":
    main()
