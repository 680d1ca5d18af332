"""A class at once: N students over TCP, each with their own token, send one grouped
query each at the same instant, every text different; the burst's makespan against
raw DuckDB running the same N queries from N threads on one connection.

    python benchmarks/burst.py                         # 100 and 300 users, 1M rows
    python benchmarks/burst.py --users 300 --rows 1M --quantum 0 250
    python benchmarks/burst.py --quantum 0 --workers 1 2   # the gate's worker processes

Each student's query is ``SELECT state, COUNT(*), SUM(income) FROM visits WHERE
age > a AND income > b GROUP BY state`` with their own ``a`` and ``b``, so no text
repeats and no analysis is shared. The gate is a real process (``dpmagic serve``)
on ``tcp:127.0.0.1``, one token per student in its ``tokens_file``, over the
visits table of ``benchmarks/visits.py`` (the same cached DuckDB file). Raw DuckDB
reads that file natively; its N threads each hold a cursor of one connection.

Per burst size, response quantum (``--quantum``: 0 turns padding off; the
policy's default is 250 ms) and worker count (``--workers``: the policy's
``gate.workers``, default 1), each side runs ``--reps`` bursts, in turn (raw, gate,
raw, gate…) after a pause, and the table gives the median makespan (first send to
last reply), the median of the bursts' p50 and p99 latencies, failures, and the
ratio gate / raw. Not a test: the figures depend on the machine, whose load is
printed with them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from data import row_count  # noqa: E402
from visits import _policy, visits_file  # noqa: E402

PAUSE_S = 1.0
BURST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Burst:
    """One burst's figures: each request's latency (seconds from the common start),
    and how many failed."""

    latencies: list[float]
    failures: int

    @property
    def makespan(self) -> float:
        return max(self.latencies, default=0.0)


def texts(users: int) -> list[str]:
    """One grouped query per user, every text different (distinct constants)."""
    return [
        "SELECT state, COUNT(*) AS n, SUM(income) AS total FROM visits "
        f"WHERE age > {u % 60} AND income > {1000 + 37 * u} GROUP BY state"
        for u in range(users)
    ]


def burst(calls: list[Callable[[], bool]]) -> Burst:
    """Every call from a thread of its own, released together by a barrier."""
    barrier = threading.Barrier(len(calls) + 1)
    done: list[float] = [0.0] * len(calls)
    ok: list[bool] = [False] * len(calls)
    start = [0.0]

    def run(i: int) -> None:
        barrier.wait()
        try:
            ok[i] = calls[i]()
        except Exception:  # a failure is counted, never hidden
            ok[i] = False
        done[i] = time.perf_counter()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    start[0] = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join(BURST_TIMEOUT_S)
    return Burst([d - start[0] for d in done], sum(not k for k in ok))


def raw_calls(con: duckdb.DuckDBPyConnection, sqls: list[str]) -> list[Callable[[], bool]]:
    cursors = [con.cursor() for _ in sqls]

    def call(cursor: duckdb.DuckDBPyConnection, sql: str) -> bool:
        cursor.execute(sql).fetchall()
        return True

    return [lambda c=c, s=s: call(c, s) for c, s in zip(cursors, sqls, strict=True)]


def gate_calls(address: str, tokens: list[str], sqls: list[str]) -> list[Callable[[], bool]]:
    host, _, port = address.removeprefix("tcp:").rpartition(":")

    def call(token: str, sql: str) -> bool:
        con = http.client.HTTPConnection(host, int(port), timeout=BURST_TIMEOUT_S)
        try:
            body = json.dumps({"sql": sql, "epsilon": 1.0, "fresh": True})
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            con.request("POST", "/v1/query", body, headers)
            reply = con.getresponse()
            reply.read()
            return reply.status == 200
        finally:
            con.close()

    return [lambda t=t, s=s: call(t, s) for t, s in zip(tokens, sqls, strict=True)]


def start_gate(policy: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "serve", "--policy", str(policy),
         "--listen", "tcp:127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    for line in proc.stdout or ():
        if "listening on" in line:
            return proc, line.rsplit("listening on ", 1)[1].strip()
    raise RuntimeError("the gate exited before listening")


def write_policy(
    database: Path, work: Path, users: int, quantum_ms: int, workers: int = 1
) -> tuple[Path, list[str]]:
    """The visits policy, padding at ``quantum_ms``, ``workers`` worker processes, one
    token per user."""
    tokens = [secrets.token_hex(16) for _ in range(users)]
    token_file = work / "tokens.toml"
    token_file.write_text(
        "[users]\n" + "".join(f'student{u} = "{t}"\n' for u, t in enumerate(tokens))
    )
    token_file.chmod(0o600)
    text = _policy(database, work).replace(
        "response_quantum_ms = 0",
        f'response_quantum_ms = {quantum_ms}\ntokens_file = "{token_file}"\nworkers = {workers}',
    )
    policy = work / "policy.toml"
    policy.write_text(text)
    return policy, tokens


def measure(
    database: Path, users: int, quantum_ms: int, reps: int, workers: int = 1
) -> dict[str, object]:
    """``reps`` bursts of raw DuckDB and of the gate, in turn."""
    sqls = texts(users)
    con = duckdb.connect(str(database), read_only=True)
    raw: list[Burst] = []
    gate: list[Burst] = []
    with tempfile.TemporaryDirectory(prefix="dpm-burst-") as folder:
        policy, tokens = write_policy(database, Path(folder), users, quantum_ms, workers)
        proc, address = start_gate(policy)
        try:
            # Warm-up: the gate's imports, in each worker (whichever accepts each call).
            burst(gate_calls(address, tokens[: 2 * workers], sqls[: 2 * workers]))
            burst(raw_calls(con, sqls[:1]))
            for rep in range(reps):
                # Each rep's texts are new to the gate: no analysis is cached.
                fresh = [s.replace("GROUP BY", f"AND {rep} = {rep} GROUP BY") for s in sqls]
                time.sleep(PAUSE_S)
                raw.append(burst(raw_calls(con, fresh)))
                time.sleep(PAUSE_S)
                gate.append(burst(gate_calls(address, tokens, fresh)))
        finally:
            proc.terminate()
            proc.wait(30)
            con.close()
    return {
        "users": users,
        "quantum_ms": quantum_ms,
        "workers": workers,
        "raw": summary(raw),
        "gate": summary(gate),
    }


def summary(bursts: list[Burst]) -> dict[str, float]:
    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {
        "makespan_s": statistics.median(b.makespan for b in bursts),
        "p50_s": statistics.median(q(b.latencies, 0.50) for b in bursts),
        "p99_s": statistics.median(q(b.latencies, 0.99) for b in bursts),
        "failures": sum(b.failures for b in bursts),
    }


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| users | quantum | workers | raw makespan | gate makespan | × | gate p50 | gate p99 "
        "| failures |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        raw, gate = r["raw"], r["gate"]
        assert isinstance(raw, dict) and isinstance(gate, dict)
        ratio = gate["makespan_s"] / raw["makespan_s"]
        lines.append(
            f"| {r['users']} | {r['quantum_ms']} ms | {r['workers']} | {raw['makespan_s']:.2f} s "
            f"| {gate['makespan_s']:.2f} s | {ratio:.2f} | {gate['p50_s']:.2f} s "
            f"| {gate['p99_s']:.2f} s | {gate['failures']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--rows", type=row_count, default=1_000_000, help="1M, 10M or a number")
    parser.add_argument("--quantum", type=int, nargs="+", default=[0, 250], help="ms; 0: off")
    parser.add_argument("--reps", type=int, default=3, help="bursts per side (median)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1], help="the gate's worker processes"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if min(args.users) < 1 or args.reps < 1 or min(args.workers) < 1:
        parser.error("--users, --reps and --workers must be at least 1")
    database = visits_file(args.rows)
    load = os.getloadavg()
    rows = [
        measure(database, users, quantum, args.reps, workers)
        for quantum in args.quantum
        for workers in args.workers
        for users in args.users
    ]
    if args.json:
        print(json.dumps({"load": load, "cores": os.cpu_count(), "bursts": rows}))
        return 0
    print(f"{args.rows:,} rows; {os.cpu_count()} cores; load {load[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; medians of {args.reps} bursts a side")  # fmt: skip
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
