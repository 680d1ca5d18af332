"""The visits workload: a real gate against raw DuckDB on the same DuckDB file.

    python benchmarks/visits.py --rows 1M
    python benchmarks/visits.py --rows 10M --reps 5

``visits(person_id = row // 3, age 0–100, income 0–200,000, state per person from
50 values, diagnosis per row from 20)``, generated deterministically by DuckDB into
a DuckDB file (cached in ``benchmarks/.data/visits-N.duckdb``). Raw DuckDB reads that
file as a native table with default settings; the gate serves the same file (policy
``max_partitions = 3``, ``max_rows_per_partition = 3``, padding off, ε = 1 per
query) from a real process over its unix socket. Each query runs once to warm up,
then ``--reps`` times, raw DuckDB and the gate in turn, each run after the same
pause (``--pause``, 50 ms by default, as a user's queries come; 0 runs them back to
back); the table gives medians and the ratio gate / raw. With
``--peers``, SmartNoise SQL and OpenDP's Polars front end answer the same SQL in
the same run (each in a venv of its own, on the same DuckDB file and its Parquet
copy, keeping up to 9 rows of a person, the reach the gate's policy allows,
ε = 1), and every tool's relative error
against raw DuckDB's exact answer is printed beside its time. Not a test: timings
depend on the machine and its load, printed with them.

    python benchmarks/visits.py --rows 10M --peers
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from data import row_count  # noqa: E402
from queries import VISITS_QUERIES, Query, indexed, relative_error  # noqa: E402

CACHE = HERE / ".data"
STATES = 50
DIAGNOSES = 20
QUERIES = {q.name: q.sql for q in VISITS_QUERIES}
# Issue 30's protocol: each run after the same 50 ms of idleness, as a user's queries
# come. Back to back (``--pause 0``), DuckDB's worker threads are still awake.
PAUSE_MS = 50.0
PEER_NAMES = {"smartnoise": "SmartNoise SQL", "opendp-polars": "OpenDP Polars"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_count, default=1_000_000, help="1M, 10M or a number")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per query (median)")
    parser.add_argument(
        "--pause",
        type=float,
        default=PAUSE_MS,
        help="ms of idleness before each timed run (default %(default)s; 0: back to back)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also SmartNoise SQL and OpenDP's Polars front end, in the same run",
    )
    args = parser.parse_args(argv)
    database = visits_file(args.rows)
    print(f"{args.rows:,} rows, {args.pause:g} ms pause before each run; "
          f"load average {os.getloadavg()[0]:.2f} at start")  # fmt: skip
    run = side_by_side(database, args.reps, args.pause / 1000)
    print(f"gate start on {args.rows:,} rows: {run.start_s[0]:.2f} s preparing the data, "
          f"{run.start_s[1]:.2f} s restarting on it; gate peak memory {run.peak_mb:.0f} MB, "
          f"raw DuckDB's process {_peak_mb('self'):.0f} MB")  # fmt: skip
    peers = {}
    if args.peers:
        visits_parquet(database)
        for peer in PEER_NAMES:
            print(f"running {PEER_NAMES[peer]}…", file=sys.stderr, flush=True)
            peers[peer] = _peer(peer, database, args.reps)
    print()
    print(_table(run, peers))
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


@dataclass
class Run:
    """Raw DuckDB's and the gate's times per query (one run of each in turn), their
    answers, the gate's start (preparing the data, then restarting on it) and its
    peak memory."""

    raw: dict[str, list[float]]
    gate: dict[str, list[float]]
    exact: dict[str, list[list]]
    answers: dict[str, list[list[list]]]
    start_s: tuple[float, float]
    peak_mb: float


def _table(run: Run, peers: dict[str, dict]) -> str:
    """Markdown: per query, raw DuckDB's median, then each tool's median, its ratio to
    raw DuckDB and its mean relative error against the exact answer."""
    tools = ["dpmagic", *(PEER_NAMES[p] for p in peers)]
    lines = [
        "| query | raw DuckDB | " + " | ".join(f"{t} | × | error" for t in tools) + " |",
        "|---|---|" + "---|---|---|" * len(tools),
    ]
    for q in VISITS_QUERIES:
        r = statistics.median(run.raw[q.name])
        exact = indexed(q, run.exact[q.name])
        cells = [q.name, _ms(r), *_cells(q, exact, r, run.gate[q.name], run.answers[q.name])]
        for peer in peers.values():
            done = peer["queries"][q.name]
            if done["status"] != "ok":
                cells += [done["status"].split(":")[0], "", ""]
            else:
                cells += _cells(q, exact, r, done["seconds"], done["answers"])
        lines.append("| " + " | ".join(cells) + " |")
    memory = ["peak memory", f"{_peak_mb('self'):.0f} MB", f"{run.peak_mb:.0f} MB", "", ""]
    for peer in peers.values():
        memory += [f"{peer['peak_mb']:.0f} MB", "", ""]
    lines.append("| " + " | ".join(memory) + " |")
    return "\n".join(lines)


def _cells(
    q: Query, exact: dict[tuple, float], raw_s: float, seconds: list[float], answers: list
) -> list[str]:
    t = statistics.median(seconds)
    error = statistics.mean(relative_error(exact, indexed(q, a)) for a in answers)
    ratio = t / raw_s
    return [_ms(t), f"{ratio:.2f}" if ratio < 10 else f"{ratio:,.0f}", f"{100 * error:.2g}%"]


def _peer(peer: str, database: Path, reps: int) -> dict:
    """A peer's times and answers, from ``tools.py`` in the peer's own venv."""
    from peers import peer_python, tool_run

    return tool_run(peer, str(peer_python(peer)), database, reps, 1.0, "visits")


def visits_parquet(database: Path) -> Path:
    """The workload's rows as Parquet beside its DuckDB file (OpenDP's Polars front end
    reads files), written once."""
    path = database.with_suffix(".parquet")
    if not path.exists():
        partial = path.with_suffix(".parquet.partial")
        con = duckdb.connect(str(database), read_only=True)
        con.execute(f"COPY visits TO '{partial}' (FORMAT parquet)")
        con.close()
        partial.rename(path)
    return path


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


def side_by_side(database: Path, reps: int, pause_s: float) -> Run:
    """Raw DuckDB and the gate per query, one run of each in turn, so that a change
    in the machine's load falls on both alike."""
    from dpmagic.client.http_gate import Gate

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
            raw, gate, exact, answers = {}, {}, {}, {}
            for name, sql in QUERIES.items():
                exact[name] = [list(r) for r in con.execute(sql).fetchall()]
                answers[name] = []
                raw[name], gate[name] = alternated(
                    lambda sql=sql: con.execute(sql).fetchall(),
                    lambda sql=sql, out=answers[name]: out.append(
                        client.query(sql, epsilon=1.0, fresh=True).rows
                    ),
                    reps,
                    pause_s,
                )
                del answers[name][0]  # the warm-up's
            peak_mb = _peak_mb(str(proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)
            con.close()
    return Run(raw, gate, exact, answers, (first_s, again_s), peak_mb)


def alternated(first, second, reps: int, pause_s: float = 0.0) -> tuple[list[float], list[float]]:
    """Each run once to warm up, then ``reps`` timed runs of each, in turn, each timed
    run after ``pause_s`` of idleness (as a user's queries come: DuckDB's worker
    threads, and the machine's idle cores, have gone to sleep by then)."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for run, out in zip((first, second), times, strict=True):
            time.sleep(pause_s)
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
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
