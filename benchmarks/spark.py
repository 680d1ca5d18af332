"""The visits workload on Spark: the gate on Spark ``local[2]`` against raw Spark SQL,
and the gate on DuckDB against raw DuckDB, in one run, with each engine's
preparation cost.

    python benchmarks/spark.py --rows 1M
    python benchmarks/spark.py --rows 10M --reps 3

The data is ``benchmarks/visits.py``'s, exported once to Parquet (cached in
``benchmarks/.data/visits-N.parquet``). Both gates serve that Parquet file from a
real process over its unix socket (policy ``max_partitions = 3``,
``max_rows_per_partition = 3``, padding off, ε = 1 per query); raw DuckDB reads
the DuckDB file, raw Spark the Parquet file in a ``local[2]`` session of this
process. Each gate is started twice: the first start prepares the data (the
preparation's cost), the second reuses it. ``--tumult`` adds Tumult Analytics on
the same data and Spark, with the same bounds and ε (``tumult_runner.py``). Needs
the ``spark`` extra and Java.
Not a test: timings depend on the machine and its load, printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from visits import (
    CACHE,
    DIAGNOSES,
    QUERIES,
    STATES,
    _count,
    _ms,
    _raw,
    _start,
    _timed,
    visits_file,
    visits_parquet,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_count, default=1_000_000, help="1M, 10M or a number")
    parser.add_argument("--reps", type=int, default=3, help="timed runs per query (median)")
    parser.add_argument(
        "--tumult", action="store_true",
        help="also Tumult Analytics on the same Spark (a venv of its own, made on first use)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    database = visits_file(args.rows)
    parquet = visits_parquet(database)
    print(f"{args.rows:,} rows; load average {os.getloadavg()[0]:.2f} at start")
    raw_duckdb = _raw(database, args.reps)
    raw_spark = _raw_spark(parquet, args.reps)
    results = {engine: _gate(parquet, engine, args.reps) for engine in ("duckdb", "spark")}
    tumult = _tumult(parquet, args.reps) if args.tumult else None
    for engine, (_, (prepare_s, restart_s)) in results.items():
        print(f"gate on {engine}: first start (preparing {args.rows:,} rows) {prepare_s:.1f} s, "
              f"restart reusing them {restart_s:.1f} s")  # fmt: skip
    head = "| query | raw DuckDB | gate on DuckDB | × | raw Spark | gate on Spark | × |"
    rule = "|---|---|---|---|---|---|---|"
    if tumult is not None:
        head, rule = head + " Tumult on Spark | × |", rule + "---|---|"
    print(f"\n{head}\n{rule}")
    for name in QUERIES:
        rd, gd = statistics.median(raw_duckdb[name]), statistics.median(results["duckdb"][0][name])
        rs, gs = statistics.median(raw_spark[name]), statistics.median(results["spark"][0][name])
        line = (f"| {name} | {_ms(rd)} | {_ms(gd)} | {gd / rd:.2f} | {_ms(rs)} | {_ms(gs)} | "
                f"{gs / rs:.2f} |")  # fmt: skip
        if tumult is not None:
            t = statistics.median(tumult[name]["times"])
            line += f" {_ms(t)} | {t / rs:.2f} |"
        print(line)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


def _tumult(parquet: Path, reps: int) -> dict[str, dict]:
    """Tumult Analytics's times on the same Parquet file and Spark (``tumult_runner.py``,
    in a venv of its own: Tumult pins pyspark < 3.6 and pandas < 2)."""
    venv = CACHE / "venv-tumult"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "tmlt.analytics"], check=True)
    runner = Path(__file__).resolve().parent / "tumult_runner.py"
    done = subprocess.run(
        [str(python), str(runner), str(parquet), "--reps", str(reps)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def _raw_spark(parquet: Path, reps: int) -> dict[str, list[float]]:
    """The queries as written, on raw Spark SQL over the Parquet file (no bounding, no
    noise): the baseline the Spark gate is measured against."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.read.parquet(str(parquet)).createOrReplaceTempView("visits")
    try:
        return {
            name: _timed(lambda sql=sql: spark.sql(sql).collect(), reps)
            for name, sql in QUERIES.items()
        }
    finally:
        spark.stop()


def _gate(parquet: Path, engine: str, reps: int) -> tuple[dict[str, list[float]], tuple]:
    from dpmagic.client.http_gate import Gate

    with tempfile.TemporaryDirectory() as work:
        policy = Path(work) / "policy.toml"
        policy.write_text(_policy(parquet, Path(work), engine))
        address = f"unix:{Path(work) / 'gate.sock'}"
        proc, first_s = _start(policy, address)
        proc.terminate()
        proc.wait(60)
        proc, again_s = _start(policy, address)
        try:
            client = Gate(address, timeout=3600)
            times = {
                name: _timed(lambda sql=sql: client.query(sql, epsilon=1.0, fresh=True), reps)
                for name, sql in QUERIES.items()
            }
        finally:
            proc.terminate()
            proc.wait(60)
    return times, (first_s, again_s)


def _policy(parquet: Path, work: Path, engine: str) -> str:
    states = [f"S{i}" for i in range(STATES)]
    diagnoses = [f"D{i}" for i in range(DIAGNOSES)]
    spark = 'engine = "spark"\nspark = { master = "local[2]" }\n' if engine == "spark" else ""
    return f"""
[gate]
state_dir = "{work / "state"}"
response_quantum_ms = 0
query_timeout_s = 3600

[datasets.visits]
{spark}sources = {{ visits = "{parquet}" }}
privacy_unit = "person_id"
max_partitions = 3
max_rows_per_partition = 3
user_budget = {{ epsilon = 1e12 }}
notebook_budget = {{ epsilon = 1e12 }}

[datasets.visits.tables.visits.columns]
person_id = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
income = {{ type = "int", lower = 0, upper = 200000 }}
state = {{ type = "str", public_values = {states} }}
diagnosis = {{ type = "str", public_values = {diagnoses} }}
"""


if __name__ == "__main__":
    sys.exit(main())
