"""Where a query's time goes: the visits workload, pass by pass, in a real gate.

    python benchmarks/per_pass.py --rows 1M
    python benchmarks/per_pass.py --rows 1000 --reps 31   # the fixed cost alone

A real gate process serves the workload of ``benchmarks/visits.py`` with a clock on
each of its passes (this script, run with ``--serve``, installs them and then runs
the gate's own ``main``); the client times each query's round trip over the unix
socket, in turn with raw DuckDB on the workload's file, each run after the same pause
(``--pause``, 50 ms by default), and then the gate's generated SQL alone on the gate's
prepared copy (read-only and planned without the data's statistics, as the gate
reads it; after the same pause).
For each query it prints medians of: raw DuckDB; the generated SQL alone; the
gate's passes (the durable debit, the run with its guard and timeout, the noise,
the release, the stored reply, the budget views); the rest of the engine's work;
the process boundary (the round trip less the gate's handling of the request:
connection, HTTP, JSON, the hand-off to an engine thread and back); and the round
trip with its ratio to raw DuckDB. Not a test: timings depend on the machine and
its load, printed with them.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
import visits
from data import row_count
from plan_statistics import attached

PASSES = ("debit", "run", "noise", "release", "reply written", "stored reply", "budget views")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_count, default=1_000_000, help="1M, 10M, a number")
    parser.add_argument("--reps", type=int, default=15, help="timed runs per query (median)")
    parser.add_argument(
        "--pause",
        type=float,
        default=visits.PAUSE_MS,
        help="ms of idleness before each timed run (default %(default)s)",
    )
    parser.add_argument("--serve", nargs=3, metavar=("POLICY", "ADDRESS", "OUT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.serve:
        return _serve(*args.serve)
    database = visits.visits_file(args.rows)
    print(f"{args.rows:,} rows, {args.pause:g} ms pause before each run; "
          f"load average {os.getloadavg()[0]:.2f} at start")  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        rows = _measure(database, Path(work), args.reps, args.pause / 1000)
    header = ["query", "raw DuckDB", "generated SQL", *PASSES, "rest of the engine",
              "process boundary", "gate", "×"]  # fmt: skip
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nall in ms; load average {os.getloadavg()[0]:.2f} at the end")
    return 0


def _measure(database: Path, work: Path, reps: int, pause_s: float) -> dict[str, list[str]]:
    policy, marks = work / "policy.toml", work / "marks.json"
    policy.write_text(visits._policy(database, work))
    address = f"unix:{work / 'gate.sock'}"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(policy), address, str(marks)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    for line in proc.stdout or ():
        if "listening" in line:
            break
    else:
        raise RuntimeError("the gate exited before listening")
    from dpmagic.client.http_gate import Gate

    client = Gate(address, timeout=600)
    raw = duckdb.connect(str(database), read_only=True)
    trips: dict[str, list[float]] = {}
    raws: dict[str, list[float]] = {}
    try:
        for name, sql in visits.QUERIES.items():
            raws[name], trips[name] = visits.alternated(
                lambda sql=sql: raw.execute(sql).fetchall(),
                lambda sql=sql: client.query(sql, epsilon=1.0, fresh=True),
                reps,
                pause_s,
            )
    finally:
        proc.terminate()
        proc.wait(30)
        raw.close()
    clocks = json.loads(marks.read_text())
    prepared = next((work / "state").rglob("*.duckdb"))
    copy = attached(prepared, statistics_on=False)
    parameters = _parameters(policy, clocks["sql"])
    rows = {}
    try:
        for i, name in enumerate(visits.QUERIES):
            # Each query's requests: one warm-up, then ``reps`` timed ones.
            timed = slice(i * (reps + 1) + 1, (i + 1) * (reps + 1))
            passes = {p: _median(clocks[p][timed]) for p in PASSES}
            handled = clocks["request"][timed]
            engine = _median(clocks["engine"][timed])
            boundary = statistics.median(
                (t - h) * 1000 for t, h in zip(trips[name], handled, strict=True)
            )
            r, g = statistics.median(raws[name]) * 1000, statistics.median(trips[name]) * 1000
            rest = engine - sum(passes.values())
            sql = clocks["sql"][i * (reps + 1)]
            generated = _alone(copy, sql, parameters[sql], reps, pause_s)
            rows[name] = [f"{r:.2f}", f"{generated:.2f}", *(f"{passes[p]:.2f}" for p in PASSES),
                          f"{rest:.2f}", f"{boundary:.2f}", f"{g:.2f}", f"{g / r:.2f}"]  # fmt: skip
    finally:
        copy.close()
    return rows


def _median(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def _parameters(policy: Path, sqls: list[str]) -> dict[str, dict | None]:
    """The values the gate binds to each generated SQL's parameters (where its scans'
    first ranks end), from the gate's own store on the same prepared file."""
    from dpmagic.gate.engines.duckdb.database import Database
    from dpmagic.gate.policy.loading import load_policy

    loaded = load_policy(policy)
    store = Database(loaded.datasets["visits"], loaded.gate)
    try:
        return {sql: store.parameters(sql) for sql in set(sqls)}
    finally:
        store.close()


def _alone(
    db: duckdb.DuckDBPyConnection, sql: str, parameters: dict | None, reps: int, pause_s: float
) -> float:
    """The generated SQL's median time on the prepared copy, fetched whole, planned as
    the gate plans it (without the data's statistics), each run after ``pause_s``."""
    times = []
    for _ in range(reps + 1):
        time.sleep(pause_s)
        start = time.perf_counter()
        db.execute(sql, parameters).fetchall()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1000


def _serve(policy: str, address: str, out: str) -> int:
    """The gate, with a clock on each pass; the clocks are written to ``out`` at exit."""
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.engines.duckdb import database
    from dpmagic.gate.ledger.store import Ledger
    from dpmagic.gate.reply import Reply
    from dpmagic.gate.service import exchange, server
    from dpmagic.gate.sql import pipeline

    clocks: dict[str, list] = {"sql": []}
    for owner, attr, label in (
        (Ledger, "debit", "debit"),
        (database.Database, "run", "run"),
        (pipeline, "noise", "noise"),
        (pipeline, "release", "release"),
        (Reply, "of", "reply written"),
        (Ledger, "record_release", "stored reply"),
        (Engine, "_with_budget", "budget views"),
        (Engine, "respond", "engine"),
        (exchange, "_run", "request"),
    ):
        setattr(owner, attr, _clocked(getattr(owner, attr), clocks.setdefault(label, [])))
    run = database.Database.run

    def noting(self: object, sql: str, *rest: object, **named: object) -> object:
        clocks["sql"].append(sql)
        return run(self, sql, *rest, **named)

    database.Database.run = noting  # type: ignore[method-assign]
    atexit.register(lambda: Path(out).write_text(json.dumps(clocks)))
    return server.main(["--policy", policy, "--listen", address])


def _clocked(function: Callable, into: list[float]) -> Callable:
    def clocked(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    return clocked


if __name__ == "__main__":
    sys.exit(main())
