"""Where a query's time goes: the visits workload, pass by pass, in a real gate.

    python benchmarks/per_pass.py --rows 1M
    python benchmarks/per_pass.py --rows 1000 --reps 31   # the fixed cost alone
    python benchmarks/per_pass.py --analysis              # a new text's analysis alone

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
trip with its ratio to raw DuckDB.

Then the analysis of texts the gate has not seen, in this process on an engine over
the same policy (and over the clinic's, ``examples/clinic.toml``): each of the
workload's shapes with its constants varied, so that no text repeats, timed in
``Engine._analysed`` (parse to plan, the rewrite, the vet) with medians per pass,
and its CPU time.
Not a test: timings depend on the machine and its load, printed with them.
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
    parser.add_argument(
        "--analysis", action="store_true", help="only the analysis of texts not seen before"
    )
    parser.add_argument("--serve", nargs=3, metavar=("POLICY", "ADDRESS", "OUT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.serve:
        return _serve(*args.serve)
    database = visits.visits_file(args.rows)
    print(f"{args.rows:,} rows, {args.pause:g} ms pause before each run; "
          f"load average {os.getloadavg()[0]:.2f} at start")  # fmt: skip
    if not args.analysis:
        _gate_passes(database, args.reps, args.pause / 1000)
    print("\nThe analysis of a text not seen before (median ms over --reps × 10 texts; CPU:")
    print("the engine thread's CPU time, less moved by the machine's load than the rest):")
    header = ["dataset", "shape", "analyse", "rewrite", "vet", "analysis", "CPU"]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    with tempfile.TemporaryDirectory() as work:
        for line in _new_texts(database, Path(work), args.reps * 10):
            print("| " + " | ".join(line) + " |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


def _gate_passes(database: Path, reps: int, pause_s: float) -> None:
    """The table of the gate's passes, each query's round trip timed by a client."""
    with tempfile.TemporaryDirectory() as work:
        rows = _measure(database, Path(work), reps, pause_s)
    header = ["query", "raw DuckDB", "generated SQL", *PASSES, "rest of the engine",
              "process boundary", "gate", "×"]  # fmt: skip
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nall in ms; load average {os.getloadavg()[0]:.2f} at the end")


# Each shape's text takes constants from its run's index, so no text repeats.
VISITS_SHAPES = {
    "count by state": "SELECT state, COUNT(*) AS n FROM visits WHERE age > {a} GROUP BY state",
    "avg income by diagnosis": "SELECT diagnosis, AVG(income) AS avg_income FROM visits "
    "WHERE income < {b} GROUP BY diagnosis",
    "sum income where age > a": "SELECT SUM(income) AS total FROM visits WHERE age > {a}",
    "count by state × diagnosis": "SELECT state, diagnosis, COUNT(*) AS n FROM visits "
    "WHERE age > {a} GROUP BY state, diagnosis",
    "the burst's query": "SELECT state, COUNT(*), SUM(income) FROM visits "
    "WHERE age > {a} AND income > {b} GROUP BY state",
}
CLINIC_SHAPES = {
    "count by department": "SELECT department, COUNT(*) AS n FROM visits "
    "WHERE stay_days > {s} GROUP BY department",
    "avg cost by diagnosis": "SELECT diagnosis, AVG(cost) AS avg_cost FROM visits "
    "WHERE age > {a} GROUP BY diagnosis",
    "join: count by sex": "SELECT p.sex, COUNT(*) AS n FROM visits AS v JOIN patients AS p "
    "ON v.patient_id = p.patient_id WHERE p.age > {a} GROUP BY p.sex",
}


def _new_texts(database: Path, work: Path, texts: int) -> list[list[str]]:
    """Per shape, medians of ``Engine._analysed`` on ``texts`` new texts, and of its
    passes: ``analyse`` (parse → plan), the rewrite, and the vet (in process)."""
    from dpmagic.examples import clinic
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.engines.duckdb.database import Database
    from dpmagic.gate.policy.loading import load_policy
    from dpmagic.gate.request import QueryRequest
    from dpmagic.gate.sql import pipeline

    (work / "visits").mkdir()
    (work / "visits" / "policy.toml").write_text(visits._policy(database, work / "visits"))
    clinic.generate(work / "clinic", patients=1000)
    policies = {
        "visits": (work / "visits" / "policy.toml", VISITS_SHAPES),
        "clinic": (clinic.write_policy(work / "clinic"), CLINIC_SHAPES),
    }
    clocks: dict[str, list[float]] = {}
    spent: dict[str, list[float]] = {}
    used: dict[str, list[float]] = {}  # CPU time
    patched = [
        (Engine, "analyse", "analyse"),
        (pipeline, "rewrite", "rewrite"),
        (pipeline, "left_out", "rewrite"),
        (Database, "vet", "vet"),
    ]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patched]
    lines = []
    try:
        for owner, attr, label in patched:
            setattr(owner, attr, _clocked(getattr(owner, attr), clocks.setdefault(label, [])))
        for name, (policy, shapes) in policies.items():
            engine = Engine(load_policy(policy))
            dataset = engine._dataset(name)
            try:
                for shape, text in shapes.items():
                    for i in range(texts + 10):  # the first 10: warm-up
                        sql = text.format(a=i, b=1000 + 7 * i, s=i)
                        request = QueryRequest.from_body({"sql": sql, "epsilon": 0.5})
                        marks = {label: len(times) for label, times in clocks.items()}
                        start, cpu = time.perf_counter(), time.thread_time()
                        engine._analysed(dataset, request)
                        whole = time.perf_counter() - start
                        used.setdefault(shape, []).append(time.thread_time() - cpu)
                        for label, times in clocks.items():  # a pass's calls, summed
                            times[marks[label] :] = [sum(times[marks[label] :])]
                        spent.setdefault(shape, []).append(whole)
                    cells = [_median(clocks[p][-texts:]) for p in ("analyse", "rewrite", "vet")]
                    cells += [_median(spent[shape][-texts:]), _median(used[shape][-texts:])]
                    lines.append([name, shape, *(f"{c:.2f}" for c in cells)])
            finally:
                engine.close()
    finally:
        for owner, attr, function in saved:
            setattr(owner, attr, function)
    return lines


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
        (Engine, "_budget_views", "budget views"),
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
