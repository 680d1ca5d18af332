"""Where a query's time goes: the visits workload, pass by pass.

    python benchmarks/per_pass.py --rows 1M
    python benchmarks/per_pass.py --rows 1000 --reps 31   # the fixed cost alone

For each query of ``benchmarks/visits.py``: raw DuckDB on the workload's file;
the gate's generated SQL alone, on the gate's prepared copy; each pass of the
gate's engine in this process (the debit, the run with its guard and timeout,
the noise, the release, the stored reply, the budget views); and the same query
through a real gate process over its unix socket, whose difference from the
engine's total is the process boundary (HTTP, JSON, threads). Medians after a
warm-up. Not a test: timings depend on the machine and its load, printed with
them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
import visits

from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy
from dpmagic.gate.service.ledger import Ledger
from dpmagic.gate.sql import pipeline

PASSES = ("debit", "run", "noise", "release", "stored reply", "budget views")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=visits._count, default=1_000_000, help="1M, 10M, a number")
    parser.add_argument("--reps", type=int, default=15, help="timed runs per query (median)")
    args = parser.parse_args(argv)
    database = visits.visits_file(args.rows)
    print(f"{args.rows:,} rows; load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory() as work:
        policy = Path(work) / "policy.toml"
        policy.write_text(visits._policy(database, Path(work)))
        passes, generated, engine_ms = _in_process(policy, args.reps)
    raw, gate, _, _ = visits.side_by_side(database, args.reps)
    header = ["query", "raw DuckDB", "generated SQL", *PASSES, "engine", "process boundary",
              "gate", "×"]  # fmt: skip
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name in visits.QUERIES:
        r, g = statistics.median(raw[name]) * 1000, statistics.median(gate[name]) * 1000
        cells = [f"{r:.2f}", f"{generated[name]:.2f}"]
        cells += [f"{passes[name][p]:.2f}" for p in PASSES]
        cells += [
            f"{engine_ms[name]:.2f}",
            f"{g - engine_ms[name]:.2f}",
            f"{g:.2f}",
            f"{g / r:.2f}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nall in ms; load average {os.getloadavg()[0]:.2f} at the end")
    return 0


def _in_process(
    policy: Path, reps: int
) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, float]]:
    """Each pass's median, the generated SQL's, and the engine's whole, per query."""
    engine = Engine(load_policy(policy))
    spent: dict[str, list[float]] = {}
    seen: list[str] = []
    store = engine.databases["visits"]
    timed = [
        (Ledger, "debit", "debit"),
        (type(store), "run", "run"),
        (pipeline, "noise", "noise"),
        (pipeline, "release", "release"),
        (Ledger, "record_release", "stored reply"),
        (Engine, "_with_budget", "budget views"),
    ]
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in timed]
    for owner, attr, label in timed:
        setattr(owner, attr, _clocked(getattr(owner, attr), spent.setdefault(label, [])))
    run = type(store).run
    try:
        type(store).run = _noting(run, seen)
        passes, generated, whole = {}, {}, {}
        for name, sql in visits.QUERIES.items():
            body = {"sql": sql, "epsilon": 1.0, "fresh": True}
            engine.query("bench", body)
            for times in spent.values():
                times.clear()
            totals = []
            for _ in range(reps):
                start = time.perf_counter()
                engine.query("bench", body)
                totals.append(time.perf_counter() - start)
            passes[name] = {p: statistics.median(spent[p]) * 1000 for p in PASSES}
            whole[name] = statistics.median(totals) * 1000
            generated[name] = _alone(store._db, seen[-1], reps)
    finally:
        for owner, attr, original in originals:
            setattr(owner, attr, original)
        engine.close()
    return passes, generated, whole


def _clocked(function: Callable, into: list[float]) -> Callable:
    def clocked(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    return clocked


def _noting(run: Callable, seen: list[str]) -> Callable:
    def noting(self: object, sql: str, *args: object) -> object:
        seen.append(sql)
        return run(self, sql, *args)

    return noting


def _alone(db: duckdb.DuckDBPyConnection, sql: str, reps: int) -> float:
    """The generated SQL's median time on the prepared copy, fetched whole."""
    times = []
    for _ in range(reps + 1):
        con = db.cursor()
        start = time.perf_counter()
        con.execute(sql).fetchall()
        times.append(time.perf_counter() - start)
        con.close()
    return statistics.median(times[1:]) * 1000


if __name__ == "__main__":
    sys.exit(main())
