"""How much time one unit can add to a query: the bound behind "after the debit,
only the timeout can fail, and one unit cannot move a query across it".

A unit's rows are cut at load to ``max_partitions × max_rows_per_partition``
(the load cap) and each text value to its column's ``max_length`` characters,
and the plan bounds, before the debit, the work one unit can add to the query
(``plan.work``, ``sql/work.py``: the joined rows one unit adds times the steps
each costs; a query whose bound is above the dataset's ``max_unit_work``,
default 2^20, is refused free). This script measures what that bound is worth
in time. It builds D (``--units`` ordinary units, one short row each) and
D + the target (a unit with the load cap's rows, each text at ``max_length``
characters, its numbers at their worst), serves both as two datasets of one
gate engine (in-process, padding off, ``fresh``, ε = 0.01, the gate's default
``query_timeout_s`` of 30 s unless ``--timeout``), runs each query on them
alternately, run by run, and prints per query the plan's bound (the rows
one unit adds to its joins, and the steps), the median times on D and on
D + the target, the median of the paired differences with a bootstrap 95%
interval, that difference per 1,000 steps of the bound (µs), and that rate
times ``max_unit_work``: what a query of this shape would add at the limit if
its time grew with its bound (a projection; a shape's fixed costs inflate it
where the bound is small). A run that fails after the debit (the timeout) stops
that query's measurement and is printed as such, with the dataset it failed on:
a query answered on D and stopped on D + the target is the failure this bound
exists to prevent.

The shapes: the text and numeric expressions of the first version, a 10-scan
self-join (and one restricted to the target), a CTE read three times, a
private group key (partition selection), distinct units, a quantile, the
window, a public table of a few hundred rows joined on a key and on a
condition; then queries sized to sit just under ``max_unit_work`` (a public
table joined on a condition, its rows chosen from the plan's own bound: the
target's rows match every row of it, the ordinary units' at most two), which
measure the added time at the limit directly; and DuckDB's ``TRY`` on a public
table joined on a key that other units share, where the target's failing rows
fall into many of the join's vectors (each such vector is evaluated again row
by row: the added time then grows with the other units' joined rows, not the
target's).

    python benchmarks/per_unit_work.py                          # DuckDB, the defaults
    python benchmarks/per_unit_work.py --engine spark           # Spark local[2]
    python benchmarks/per_unit_work.py --engine both --only limit

Not a test: timings depend on the machine (its load is printed with them).
Spark needs the ``spark`` extra and Java 17; Spark refuses what DuckDB
evaluates under ``TRY`` (``sql/engine_rows.py``), and the refusals are printed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import duckdb

from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError, Refused
from dpmagic.gate.policy import DEFAULT_MAX_LENGTH, Dataset, load_policy
from dpmagic.gate.sql.pipeline import Asked, analyse

TARGET = -1  # the target unit's pid
EPSILON = 0.01
SELF_JOIN = "SELECT COUNT(*) FROM t a " + " ".join(
    f"JOIN t {n} ON {n}.pid = a.pid" for n in "bcdefghij"
)
QUERIES = {
    "ILIKE with wildcards": "SELECT COUNT(*) FROM t WHERE s ILIKE '%a%b%z%'",
    "LIKE with five wildcards": "SELECT COUNT(*) FROM t WHERE s LIKE '%a%b%a%b%z%'",
    "nested text functions": (
        "SELECT COUNT(*) FROM t WHERE LENGTH(UPPER(LOWER(s || s)) || TRIM(s)) > 3"
    ),
    "grouped by a text key": ("SELECT k, COUNT(*) FROM t WHERE UPPER(s) LIKE '%Q%' GROUP BY k"),
    "arithmetic under TRY": "SELECT SUM(LEAST(GREATEST(x * x * x, 0), 1000)) FROM t",
    "10-scan self-join": SELF_JOIN,
    "10-scan self-join, WHERE a.pid = target": f"{SELF_JOIN} WHERE a.pid = {TARGET}",
    "CTE read 3 times, JOIN USING (pid)": (
        "WITH u AS (SELECT pid, y, s FROM t WHERE s LIKE '%b%') "
        "SELECT COUNT(*) FROM u JOIN u AS v USING (pid) JOIN u AS w USING (pid) "
        "WHERE v.y + w.y >= 0"
    ),
    "grouped by a private key (partition selection)": (
        "SELECT g, COUNT(*) FROM t WHERE UPPER(g) LIKE 'G%' GROUP BY g"
    ),
    "COUNT(DISTINCT pid)": "SELECT COUNT(DISTINCT pid) FROM t WHERE s LIKE '%a%'",
    "MEDIAN of a bounded int": "SELECT MEDIAN(y) FROM t",
    "window: grouped by a public table's column": (
        "SELECT p.zone, COUNT(*) FROM t JOIN p ON p.code = t.c GROUP BY p.zone"
    ),
    "public table joined on a key": (
        "SELECT SUM(t.c) FROM t JOIN p ON p.code = t.c WHERE p.label || t.s LIKE '%b%'"
    ),
    "public table joined on a condition": (
        "SELECT COUNT(*) FROM t JOIN p ON p.code < t.y WHERE p.label || t.s LIKE '%b%'"
    ),
}
# Queries that need δ > 0 (partition selection releases keys found in the data).
DELTA = {"grouped by a private key (partition selection)": 1e-6}
# Sized to sit just under max_unit_work: each query's public table gets the rows that put
# the plan's bound there (``_limit_sizes``). Ordinary units have y < 3, so they match at
# most two of its rows; the target's y is the column's upper bound: each of its rows
# matches every row of the table.
SIX_SUMS = ", ".join(f"SUM(LEAST(GREATEST(t.x * q6.code + {i}, 0), 1))" for i in range(6))
AT_THE_LIMIT = {
    "at the limit: numeric, condition join": (
        "qn",
        "SELECT COUNT(*) FROM t JOIN qn ON qn.code < t.y WHERE qn.code % 7 <= t.y",
    ),
    "at the limit: text, condition join": (
        "qt",
        "SELECT COUNT(*) FROM t JOIN qt ON qt.code < t.y "
        "WHERE UPPER(t.s || qt.label) LIKE '%A%B%Z%'",
    ),
    "at the limit: 10-scan self-join, condition join": (
        "qs",
        SELF_JOIN.replace("FROM t a ", "FROM t a JOIN qs ON qs.code < a.y "),
    ),
    "at the limit: arithmetic under TRY, condition join": (
        "qa",
        "SELECT SUM(LEAST(GREATEST(t.x * qa.code, 0), 1)) FROM t JOIN qa ON qa.code < t.y",
    ),
    "at the limit: six sums under TRY, condition join": (
        "q6",
        f"SELECT {SIX_SUMS} FROM t JOIN q6 ON q6.code < t.y",
    ),
}
LIMIT_TABLES = tuple(table for table, _ in AT_THE_LIMIT.values())
# A public table joined on a key the target shares with other units: ``--shared-rows``
# rows (default: twice D's units, so the engine builds its hash table on t and probes
# with this table, emitting each code's units together), codes cycling over
# SHARED_CODES values, as the ordinary units' c does; the target's c is 7.
SHARED = {
    "TRY on a key join shared with other units": (
        "SELECT SUM(LEAST(GREATEST(t.x * pk.code, 0), 1)) FROM t JOIN pk ON pk.code = t.c"
    ),
    "the same, no row failing": (
        "SELECT SUM(LEAST(GREATEST(t.c * pk.code, 0), 1)) FROM t JOIN pk ON pk.code = t.c"
    ),
}
SHARED_CODES = 3000
# Run last on Spark: its LIKE is a java.util.regex match, which backtracks through the
# target's long texts for far longer than the timeout, and a task stuck in it is not
# interrupted by the timeout's cancellation: it keeps Spark's task slots after the gate
# has answered, so nothing measured after it on the same session would be clean.
SPARK_LAST = ("LIKE with five wildcards", "at the limit: text, condition join")
Y_UPPER = 1_000_000
PUBLIC_ROWS = 300  # p, a public table of a few hundred rows
PUBLIC_TABLES = ("p", "pk", *LIMIT_TABLES)

POLICY = """
[gate]
state_dir = "{state}"
response_quantum_ms = 0
query_timeout_s = {timeout}
{datasets}
"""
DATASET = """
[datasets.{name}]
{spark}accountant = "approx"
sources = {{ {sources} }}
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = {rows}
user_budget = {{ epsilon = 1e9, delta = 0.5 }}
notebook_budget = {{ epsilon = 1e9, delta = 0.5 }}

[datasets.{name}.tables.t.columns]
pid = {{ type = "int" }}
x = {{ type = "int" }}
y = {{ type = "int", lower = 0, upper = {y_upper} }}
c = {{ type = "int", lower = 0, upper = {c_last} }}
k = {{ type = "str", public_values = ["a", "b", "c"] }}
s = {{ type = "str", max_length = {length} }}
g = {{ type = "str", max_length = {length} }}

[datasets.{name}.tables.p]
public = true
[datasets.{name}.tables.p.columns]
code = {{ type = "int" }}
zone = {{ type = "int" }}
label = {{ type = "str", max_length = 16 }}
"""
PUBLIC_TABLE = """
[datasets.{name}.tables.{table}]
public = true
[datasets.{name}.tables.{table}.columns]
code = {{ type = "int" }}
label = {{ type = "str", max_length = 16 }}
"""


def _write_data(folder: Path, units: int, rows: int, length: int, sizes: dict[str, int]) -> dict:
    """Parquet files: t without and with the target, and the public tables."""
    con = duckdb.connect()
    ordinary = (
        f"SELECT range AS pid, range % 1000 AS x, range % 3 AS y, range % {SHARED_CODES} AS c, "
        "['a', 'b', 'c'][range % 3 + 1] AS k, 'ab' AS s, 'g' || (range % 50) AS g "
        f"FROM range({units})"
    )
    # The most a unit can keep: the load cap's rows, each text at max_length, x at the
    # int's maximum (x * x * x and x * code overflow), y at its upper bound (it matches
    # every row of a public table joined on code < y), each row a group key of its own.
    target = (
        f"SELECT {TARGET}, 9223372036854775807, {Y_UPPER}, 7, 'a', "
        f"repeat('ab', {(length + 1) // 2})[1:{length}], lpad(range::VARCHAR, {length}, 'G') "
        f"FROM range({rows})"
    )
    files = {"without": folder / "t-without.parquet", "with": folder / "t-with.parquet"}
    con.execute(f"COPY ({ordinary}) TO '{files['without']}' (FORMAT parquet)")
    con.execute(f"COPY ({ordinary} UNION ALL {target}) TO '{files['with']}' (FORMAT parquet)")
    public = {
        "p": f"SELECT range AS code, range % 5 AS zone, 'L' || range AS label "
        f"FROM range({PUBLIC_ROWS})",
        "pk": f"SELECT range % {SHARED_CODES} AS code, 'L' AS label FROM range({sizes['pk']})",
    }
    for table in LIMIT_TABLES:
        public[table] = f"SELECT range AS code, 'L' || range AS label FROM range({sizes[table]})"
    for name, sql in public.items():
        files[name] = folder / f"{name}.parquet"
        con.execute(f"COPY ({sql}) TO '{files[name]}' (FORMAT parquet)")
    con.close()
    return files


def _policy_text(
    folder: Path, files: dict, engine: str, rows: int, length: int, timeout: float = 30
) -> str:
    spark = 'engine = "spark"\nspark = { master = "local[2]" }\n' if engine == "spark" else ""

    def sources(name: str) -> str:
        tables = {"t": files[name], **{p: files[p] for p in PUBLIC_TABLES}}
        return ", ".join(f'{table} = "{path}"' for table, path in tables.items())

    facts = {"spark": spark, "rows": rows, "length": length, "y_upper": Y_UPPER}
    datasets = "".join(
        DATASET.format(name=name, sources=sources(name), c_last=SHARED_CODES - 1, **facts)
        + "".join(PUBLIC_TABLE.format(name=name, table=q) for q in PUBLIC_TABLES[1:])
        for name in ("without", "with")
    )
    return POLICY.format(state=folder / f"state-{engine}", timeout=timeout, datasets=datasets)


def _limit_sizes(folder: Path, rows: int, length: int) -> dict[str, int]:
    """Rows of each AT_THE_LIMIT table that put its query just under max_unit_work: the
    bound is the rows one unit adds (its cap times the public table's rows, which a
    condition join can all match) times the steps per row, so it is linear in the
    table's rows. Read from the plan of a policy whose tables have one row."""
    files = {n: folder / f"{n}.none" for n in ("without", "with", *PUBLIC_TABLES)}
    path = folder / "sizing.toml"
    path.write_text(_policy_text(folder, files, "duckdb", rows, length))
    dataset = load_policy(path).dataset("with")
    tables = {n: replace(t, rows=1) if t.public else t for n, t in dataset.tables.items()}
    dataset = replace(dataset, tables=tables)
    sizes = {}
    for table, sql in AT_THE_LIMIT.values():
        try:
            one = _work(sql, dataset).total
        except GateError:  # refused whatever the size: reported with the results
            one = dataset.max_unit_work
        sizes[table] = max(1, (dataset.max_unit_work // one) - 1)
    return sizes


def _work(sql: str, dataset: Dataset, delta: float = 0.0):
    """The plan's work bound (``plan.work``), as the gate analyses the query."""
    asked = Asked(sql, {}, EPSILON, delta)
    return analyse(asked, dataset, make_accountant(dataset.accountant)).work


def _run(engine: Engine, dataset: str, sql: str, delta: float) -> float:
    body = {"sql": sql, "dataset": dataset, "epsilon": EPSILON, "delta": delta, "fresh": True}
    start = time.perf_counter()
    engine.query("bench", body)
    return time.perf_counter() - start


class Stopped(Exception):
    """A run failed after the debit (the gate's timeout, or memory): on which dataset,
    after how long, and D's times so far."""

    def __init__(self, dataset: str, seconds: float, message: str, without: list[float]):
        super().__init__(message)
        self.dataset, self.seconds, self.message, self.without = dataset, seconds, message, without


def _measure(engine: Engine, sql: str, delta: float, reps: int) -> tuple[list[float], list[float]]:
    """Times (s) on D and D + the target, run by run in alternating order, after one
    untimed run of each (the analysis is then cached, as for a user's re-run). A run
    that fails after the debit stops the measurement (``Stopped``)."""
    without: list[float] = []
    with_it: list[float] = []

    def run(dataset: str, into: list[float] | None) -> None:
        start = time.perf_counter()
        try:
            took = _run(engine, dataset, sql, delta)
        except Refused:
            raise
        except GateError as exc:
            seconds = time.perf_counter() - start
            raise Stopped(dataset, seconds, exc.message, without) from None
        if into is not None:
            into.append(took)

    run("without", None)
    run("with", None)
    for i in range(reps):
        order = [("without", without), ("with", with_it)]
        for dataset, into in order if i % 2 == 0 else order[::-1]:
            run(dataset, into)
    return without, with_it


def _difference(without: list[float], with_it: list[float]) -> tuple[float, float, float]:
    """The median of the paired differences (ms) and a bootstrap 95% interval of it."""
    diffs = [(b - a) * 1000 for a, b in zip(without, with_it, strict=True)]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(2000))
    return statistics.median(diffs), medians[50], medians[1949]


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def _bench(kind: str, args: argparse.Namespace, sizes: dict[str, int]) -> None:
    units = args.units if kind == "duckdb" else args.spark_units
    reps = args.reps if kind == "duckdb" else args.spark_reps
    sizes = {**sizes, "pk": args.shared_rows or 2 * units}
    print(
        f"\n## {kind}: {units:,} units of one short row; the target keeps "
        f"{args.rows_per_unit} rows of {args.max_length:,} characters; public tables' rows: "
        f"p {PUBLIC_ROWS}, pk {sizes['pk']:,} ({SHARED_CODES:,} codes), "
        + ", ".join(f"{t} {sizes[t]:,}" for t in LIMIT_TABLES)
        + f"; median of {reps}; {_load()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = _write_data(folder, units, args.rows_per_unit, args.max_length, sizes)
        policy = folder / "policy.toml"
        policy.write_text(
            _policy_text(folder, files, kind, args.rows_per_unit, args.max_length, args.timeout)
        )
        started = time.perf_counter()
        engine = Engine(load_policy(policy))
        print(f"(both datasets prepared in {time.perf_counter() - started:.1f} s)\n")
        dataset = engine.policy.dataset("with")
        limit = dataset.max_unit_work
        queries = {**QUERIES, **{k: sql for k, (_, sql) in AT_THE_LIMIT.items()}, **SHARED}
        if args.only:
            queries = {k: v for k, v in queries.items() if args.only.lower() in k.lower()}
        if kind == "spark":
            queries = dict(sorted(queries.items(), key=lambda kv: kv[0] in SPARK_LAST))
        print(
            "| query | rows | steps | D (ms) | D+target (ms) | difference (ms) [95%] | "
            f"µs per 1,000 steps | × {limit:,} steps (ms) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        projected, measured, refused, stopped = [], [], {}, {}
        for label, sql in queries.items():
            if kind == "spark" and stopped:
                print(f"| {label} | not run: Spark's task slots are held by a stopped query | "
                      "| | | | | |")  # fmt: skip
                continue
            delta = DELTA.get(label, 0.0)
            try:
                work = _work(sql, dataset, delta)
                without, with_it = _measure(engine, sql, delta, reps)
            except Refused as exc:
                refused[label] = (sql, exc.message)
                print(f"| {label} | refused | | | | | | |")
                continue
            except Stopped as exc:
                stopped[label] = (sql, exc)
                d = f"{statistics.median(exc.without) * 1000:.1f}" if exc.without else "–"
                where = "D+target" if exc.dataset == "with" else "D"
                print(
                    f"| {label} | {work.rows:,} | {work.total:,} | {d} | "
                    f"**{where} stopped after {exc.seconds:.1f} s** | | | |"
                )
                continue
            a, b = statistics.median(without) * 1000, statistics.median(with_it) * 1000
            diff, low, high = _difference(without, with_it)
            at_limit = diff * limit / work.total
            print(
                f"| {label} | {work.rows:,} | {work.total:,} | {a:.1f} | {b:.1f} | "
                f"{diff:+.1f} [{low:+.1f}, {high:+.1f}] | {diff * 1e6 / work.total:+.2f} | "
                f"{at_limit:+.1f} |"
            )
            projected.append((at_limit, label))
            if label in AT_THE_LIMIT:
                measured.append((diff, label, work.total))
        print(f"\n{_load()} at the end")
        if projected:
            at_limit, label = max(projected)
            print(f"highest projection to {limit:,} steps: {label!r}, {at_limit:+.1f} ms")
        if measured:
            diff, label, total = max(measured)
            print(f"most added at the limit: {label!r}, {diff:+.1f} ms at {total:,} steps")
        print("(the default padding quantum, response_quantum_ms, is 250 ms)")
        for label, (sql, message) in refused.items():
            print(f"refused: {label}: {sql}\n  {message}")
        for label, (sql, exc) in stopped.items():
            where = "D + the target" if exc.dataset == "with" else "D"
            print(f"stopped on {where}: {label}: {sql}\n  {exc.message}")
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("duckdb", "spark", "both"), default="duckdb")
    parser.add_argument("--units", type=int, default=100_000, help="D's units on DuckDB")
    parser.add_argument("--spark-units", type=int, default=10_000, help="D's units on Spark")
    parser.add_argument("--rows-per-unit", type=int, default=10, help="the load cap")
    parser.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH)
    parser.add_argument("--reps", type=int, default=15, help="runs per query on DuckDB")
    parser.add_argument("--spark-reps", type=int, default=4, help="runs per query on Spark")
    parser.add_argument("--shared-rows", type=int, help="pk's rows (default: twice the units)")
    parser.add_argument("--only", help="run only the queries whose label contains this")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="query_timeout_s (the gate's default: 30)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sizes = _limit_sizes(Path(tmp), args.rows_per_unit, args.max_length)
    for kind in ("duckdb", "spark") if args.engine == "both" else (args.engine,):
        _bench(kind, args, sizes)


if __name__ == "__main__":
    main()
