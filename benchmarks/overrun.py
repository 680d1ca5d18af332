"""How long past its deadline a run replies, and how long its engine goes on, per shape,
on DuckDB and on Spark ``local[2]`` (issue 38, item 3's time).

    python benchmarks/overrun.py                # DuckDB
    python benchmarks/overrun.py --spark        # and Spark (the spark extra, Java 17+)

Each shape is a query slower than the time limit (``--timeout``, drawn per run over
its last quarter), run ``--reps`` times through a store, inside an admission's share
of the engine as the gate runs it. Per run: when the store raised ``OutOfResources``
after the run's deadline (the reply leaves at the next padding quantum after that),
and when the engine's work truly stopped, which is when the reply left before
``engines/deadline.py`` (the caller waited for the engine). The shapes: a join slow in
total (each row cheap: the interrupt lands between vectors at once), a hash
aggregation over a cross product, and rows slow each (a ``LIKE`` that retries at
every position of a long text: one vector of 2,048 such rows takes seconds on
DuckDB, which looks for an interrupt only between vectors). Raw SQL through the
store: the analysis, which now refuses the slow rows (``sql/work.py``), is not in
the way; this measures what the engine does when something slow gets through. An
engine still running ``STOP_WAIT_S`` after the deadline is reported at that.
Not a test: timings depend on the machine and its load, printed with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

import duckdb

from dpmagic.gate.engines import sharing
from dpmagic.gate.engines.duckdb.database import Database
from dpmagic.gate.engines.interface import OutOfResources
from dpmagic.gate.engines.sharing import Sharing
from dpmagic.gate.policy import parse_policy

ROWS = 60_000


def _slow_rows(reps: int, pattern: int) -> str:
    """Each row's text its own (a column of ten values, evaluated once per dictionary
    entry, would be cheap), matched at every position up to the pattern's end."""
    return (
        f"SELECT COUNT(*) FROM t WHERE replace(repeat(s, {reps}), 'x', '') "
        f"|| CAST(pid AS STRING) LIKE '%' || repeat('a_', {pattern}) || 'b%'"
    )


SHAPES = {
    "join, slow in total": "SELECT COUNT(*) FROM t a JOIN t b ON a.v < b.v",
    "aggregation over a cross product": (
        "SELECT COUNT(DISTINCT a.pid * 100000 + b.pid) FROM t a, t b WHERE b.pid < 5000"
    ),
    "rows of ~0.1 ms (LIKE over 200 characters)": _slow_rows(100, 100),
    "rows of ~1 ms (LIKE over 2,000 characters)": _slow_rows(1000, 100),
    "rows of ~5 ms (LIKE over 4,000 characters)": _slow_rows(2000, 200),
}
SPARK_SHAPES = {
    "join, slow in total": SHAPES["join, slow in total"],
    "aggregation over a cross product": SHAPES["aggregation over a cross product"],
    "rows of LIKE over 600 characters": _slow_rows(300, 50),
    # Spark matches a LIKE by a Java regular expression, which backtracks and never
    # looks for an interrupt: two rows of it, seconds to minutes each.
    "two rows, LIKE with five %": (
        "SELECT COUNT(*) FROM t WHERE pid = 7 AND "
        "concat(repeat('abcd', 150), CAST(pid AS STRING)) LIKE '%a%b%c%d%z%'"
    ),
}
# How long to wait for an engine to stop before saying it had not.
STOP_WAIT_S = 60.0


def _data(folder: Path) -> Path:
    path = folder / "t.parquet"
    duckdb.sql(
        f"COPY (SELECT range // 2 AS pid, (range * 7919) % 1500 AS v, "
        f"'a' || (range % 10)::VARCHAR || 'x' AS s FROM range({ROWS})) "
        f"TO '{path}' (FORMAT parquet)"
    )
    return path


def _policy(folder: Path, path: Path, timeout: float, spark: bool) -> dict:
    dataset: dict = {
        "sources": {"t": str(path)},
        "privacy_unit": "pid",
        "user_budget": {"epsilon": 1.0},
        "tables": {
            "t": {
                "columns": {
                    "pid": {"type": "int"},
                    "v": {"type": "int", "lower": 0, "upper": 1500},
                    "s": {"type": "str"},
                }
            }
        },
    }
    if spark:
        dataset |= {"engine": "spark", "spark": {"master": "local[2]"}}
    return {
        "gate": {"state_dir": str(folder / "state"), "query_timeout_s": timeout, "threads": 2},
        "datasets": {"d": dataset},
    }


def _store(folder: Path, path: Path, timeout: float, spark: bool):
    policy = parse_policy(_policy(folder, path, timeout, spark), folder / "policy.toml")
    if spark:
        from dpmagic.gate.engines.spark.database import SparkDatabase

        return SparkDatabase(policy.dataset("d"), policy.gate)
    return Database(policy.dataset("d"), policy.gate)


def _once(store, sql: str) -> tuple[float, float] | None:
    """(seconds from the deadline to the raise, to the engine's stop); ``None`` if the
    run was answered in time."""
    engine = Sharing()
    share = engine.join()
    try:
        with sharing.counted_on(share):
            store.run(sql)
        return None
    except OutOfResources as exc:
        raised = time.monotonic()
        wait(share.lingering, timeout=STOP_WAIT_S)
        return raised - exc.release_at, time.monotonic() - exc.release_at
    finally:
        engine.leave(share)


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.1f}, max {max(values) * 1000:7.1f} ms"


def _bench(store, shapes: dict[str, str], reps: int, engine: str) -> None:
    for name, sql in shapes.items():
        if engine == "Spark":
            # Spark's guard lets the generated SQL's functions only (not ``repeat``): this
            # text is the engine's test, passed by hand.
            store._vetted.add(sql)
        runs = [r for r in (_once(store, sql) for _ in range(reps)) if r is not None]
        if not runs:
            print(f"{engine:7} {name:42} answered within the limit")
            continue
        replied, stopped = [r for r, _ in runs], [s for _, s in runs]
        engine_stopped = (
            f"engine stopped {_ms(stopped)}"
            if max(stopped) < STOP_WAIT_S
            else f"engine not stopped {STOP_WAIT_S:.0f} s after the deadline"
        )
        print(
            f"{engine:7} {name:42} reply ready past the deadline {_ms(replied)}; "
            f"{engine_stopped} ({len(runs)} runs)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="Spark too")
    parser.add_argument("--spark-only", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _data(folder)
        if not args.spark_only:
            store = _store(folder, path, args.timeout, spark=False)
            _bench(store, SHAPES, args.reps, "DuckDB")
            store.close()
        if args.spark or args.spark_only:
            store = _store(folder, path, args.timeout, spark=True)
            _bench(store, SPARK_SHAPES, args.reps, "Spark")
            store.close()


if __name__ == "__main__":
    main()
