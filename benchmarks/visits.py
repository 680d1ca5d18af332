"""The visits workload: a real gate against raw DuckDB on the same DuckDB file.

    python benchmarks/visits.py --rows 1M
    python benchmarks/visits.py --rows 10M --reps 5

``visits(person_id = row // 3, age 0–100, income 0–200,000, state per person from
50 values, diagnosis per row from 20)``, generated deterministically by DuckDB into
a DuckDB file (cached in ``benchmarks/.data/visits-N.duckdb``). Raw DuckDB reads that
file as a native table with default settings; the gate serves the same file (policy
``max_partitions = 3``, ``max_rows_per_partition = 3``, padding off, ε = 1 per
query) from a real process over its unix socket. Each query runs once to warm up,
then ``--reps`` times; the table gives medians and the ratio gate / raw. Not a
test: timings depend on the machine and its load, printed with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".data"
STATES = 50
DIAGNOSES = 20
QUERIES = {
    "count by state": "SELECT state, COUNT(*) AS n FROM visits GROUP BY state",
    "avg income by diagnosis": (
        "SELECT diagnosis, AVG(income) AS mean_income FROM visits GROUP BY diagnosis"
    ),
    "sum income where age > 65": "SELECT SUM(income) AS total FROM visits WHERE age > 65",
    "count by state × diagnosis": (
        "SELECT state, diagnosis, COUNT(*) AS n FROM visits GROUP BY state, diagnosis"
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_count, default=1_000_000, help="1M, 10M or a number")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per query (median)")
    args = parser.parse_args(argv)
    database = visits_file(args.rows)
    print(f"{args.rows:,} rows; load average {os.getloadavg()[0]:.2f} at start")
    raw, gate, start_s, peak_mb = side_by_side(database, args.reps)
    print(f"gate start on {args.rows:,} rows: {start_s[0]:.2f} s preparing the data, "
          f"{start_s[1]:.2f} s restarting on it; gate peak memory {peak_mb:.0f} MB, "
          f"raw DuckDB's process {_peak_mb('self'):.0f} MB")  # fmt: skip
    print("\n| query | raw DuckDB | gate | × |\n|---|---|---|---|")
    for name in QUERIES:
        r, g = statistics.median(raw[name]), statistics.median(gate[name])
        print(f"| {name} | {_ms(r)} | {_ms(g)} | {g / r:.2f} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


def visits_file(rows: int) -> Path:
    """The workload's DuckDB file, generated once per size."""
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"visits-{rows}.duckdb"
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    con = duckdb.connect(str(partial))
    con.execute(
        f"""
        CREATE TABLE visits AS
        SELECT range // 3 AS person_id,
               CAST(hash(range, 1) % 101 AS INTEGER) AS age,
               CAST(hash(range, 2) % 200001 AS INTEGER) AS income,
               'S' || CAST(hash(range // 3, 3) % {STATES} AS VARCHAR) AS state,
               'D' || CAST(hash(range, 4) % {DIAGNOSES} AS VARCHAR) AS diagnosis
        FROM range({rows})
        """
    )
    con.close()
    partial.rename(path)
    return path


def _raw(database: Path, reps: int) -> dict[str, list[float]]:
    con = duckdb.connect(str(database), read_only=True)
    try:
        return {
            name: _timed(lambda sql=sql: con.execute(sql).fetchall(), reps)
            for name, sql in QUERIES.items()
        }
    finally:
        con.close()


def side_by_side(
    database: Path, reps: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], tuple[float, float], float]:
    """Raw DuckDB's and the gate's times per query, one run of each in turn, so that
    a change in the machine's load falls on both alike; the gate's start with a first
    preparation of the data and its restart reusing it (``start_s``); and its peak
    memory."""
    from dpmagic.client import Gate

    con = duckdb.connect(str(database), read_only=True)
    with tempfile.TemporaryDirectory() as work:
        policy = Path(work) / "policy.toml"
        policy.write_text(_policy(database, Path(work)))
        address = f"unix:{Path(work) / 'gate.sock'}"
        proc, first_s = _start(policy, address)
        proc.terminate()
        proc.wait(30)
        proc, again_s = _start(policy, address)
        try:
            client = Gate(address, timeout=600)
            raw, gate = {}, {}
            for name, sql in QUERIES.items():
                raw[name], gate[name] = _alternated(
                    lambda sql=sql: con.execute(sql).fetchall(),
                    lambda sql=sql: client.query(sql, epsilon=1.0, fresh=True),
                    reps,
                )
            peak_mb = _peak_mb(str(proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)
            con.close()
    return raw, gate, (first_s, again_s), peak_mb


def _alternated(first, second, reps: int) -> tuple[list[float], list[float]]:
    """Each run once to warm up, then ``reps`` timed runs of each, in turn."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for run, out in zip((first, second), times, strict=True):
            start = time.perf_counter()
            run()
            out.append(time.perf_counter() - start)
    return times


def _start(policy: Path, address: str) -> tuple[subprocess.Popen, float]:
    """A gate process, once it listens, and how long that took."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "serve", "--policy", str(policy), "--listen", address],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    for line in proc.stdout or ():
        if "listening" in line:
            return proc, time.perf_counter() - start
    raise RuntimeError("the gate exited before listening")


def _peak_mb(pid: str) -> float:
    """A process's peak resident memory (Linux: VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def _policy(database: Path, work: Path) -> str:
    states = [f"S{i}" for i in range(STATES)]
    diagnoses = [f"D{i}" for i in range(DIAGNOSES)]
    return f"""
[gate]
state_dir = "{work / "state"}"
response_quantum_ms = 0
query_timeout_s = 600

[datasets.visits]
database = "{database}"
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


def _timed(run, reps: int) -> list[float]:
    run()  # warm-up: caches, the gate's analysis of this text
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        out.append(time.perf_counter() - start)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _count(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


if __name__ == "__main__":
    sys.exit(main())
