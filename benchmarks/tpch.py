"""The 22 TPC-H queries against the gate: what it answers, how well, how fast.

    python benchmarks/tpch.py --sf 0.1
    python benchmarks/tpch.py --sf 0.1 1 --runs 20 --json tpch.json
    python benchmarks/tpch.py --sf 0.1 --queries 1,6,13
    python benchmarks/tpch.py --sf 0.1 --engine spark   # the spark extra
    python benchmarks/tpch.py --sf 1 --clip 0.25        # each query with --clip 0.25

TPC-H data from ``tpchgen-cli`` (the ``bench`` extra), generated once per scale
factor under ``benchmarks/.data/`` and loaded into a DuckDB file that declares the
schema's primary and foreign keys. ``examples/tpch.toml`` serves it: ``customer`` is
the person, ``orders`` and ``lineitem`` reach it by key, the rest is public and
readable. Each query of ``benchmarks/tpch/`` is sent unmodified at ε = 1 (and the
policy's default δ) to a real engine (the gate's, in this process: its analysis,
ledger, engine run and release, without the socket), fresh each time:

- **status**: answered (with noise, or exactly where it reads public tables only)
  or refused, with the gate's one-line reason;
- **error**: the median relative error of its noisy cells over ``--runs`` runs, each
  cell matched to raw DuckDB's answer by the row's exact cells (its keys);
- **latency**: the gate's median time per query against raw DuckDB's on the same
  data, run in turn after the same pause.

With ``--clip SHARE`` each query is asked as ``%%dpsql --clip SHARE`` would ask it
(value bounds and rows per person chosen from the data with that share of the ε);
a query the gate will not clip is asked plainly, and the table says why.

Not a test: numbers depend on the machine and its load, printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError
from dpmagic.gate.policy import load_policy

HERE = Path(__file__).resolve().parent
QUERIES = HERE / "tpch"
CACHE = HERE / ".data"
POLICY = HERE.parent / "examples" / "tpch.toml"
# The queries that read only public tables (parts, suppliers, the geography).
PUBLIC_ONLY = {2, 11, 16}
PAUSE_S = 0.05
KEYS = {
    "customer": "c_custkey BIGINT PRIMARY KEY",
    "orders": "o_orderkey BIGINT PRIMARY KEY",
    "part": "p_partkey BIGINT PRIMARY KEY",
    "supplier": "s_suppkey BIGINT PRIMARY KEY",
    "nation": "n_nationkey BIGINT PRIMARY KEY",
    "region": "r_regionkey BIGINT PRIMARY KEY",
}
REFERENCES = {
    "orders": {"o_custkey": "customer (c_custkey)"},
    "lineitem": {"l_orderkey": "orders (o_orderkey)"},
}
ORDER = ["region", "nation", "supplier", "part", "partsupp", "customer", "orders", "lineitem"]


def database(sf: float) -> Path:
    """The TPC-H DuckDB file at scale factor ``sf``, generated and loaded once."""
    folder = CACHE / f"tpch-sf{sf:g}"
    target = folder / "tpch.duckdb"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    tool = shutil.which("tpchgen-cli") or str(Path(sys.executable).parent / "tpchgen-cli")
    print(f"generating TPC-H at SF {sf:g} …", flush=True)
    subprocess.run([tool, "parquet", "-s", f"{sf:g}", f"--output-dir={folder}"], check=True)
    partial = folder / "tpch.duckdb.partial"
    partial.unlink(missing_ok=True)
    con = duckdb.connect(str(partial))
    for table in ORDER:
        source = f"'{folder / (table + '.parquet')}'"
        columns = con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
        parts = []
        for name, kind, *_ in columns:
            kind = "DOUBLE" if kind.startswith("DECIMAL") else kind
            declared = KEYS.get(table, "")
            if declared.startswith(name + " "):
                parts.append(declared)
                continue
            ref = REFERENCES.get(table, {}).get(name)
            parts.append(f"{name} {kind}" + (f" REFERENCES {ref}" if ref else ""))
        con.execute(f"CREATE TABLE {table} ({', '.join(parts)})")
        con.execute(f"INSERT INTO {table} SELECT * FROM {source}")
    con.close()
    partial.rename(target)
    return target


def engine(data: Path, folder: Path, on: str = "duckdb") -> Engine:
    """The example policy over ``data``, with budgets for many runs; ``on = "spark"``
    serves the same tables from their Parquet files with Spark (``local[2]``)."""
    if on == "spark":
        sources = ", ".join(f'{t} = "{data.parent / (t + ".parquet")}"' for t in ORDER)
        served = f'engine = "spark"\nspark = {{ master = "local[2]" }}\nsources = {{ {sources} }}'
    else:
        served = f'database = "{data}"'
    text = POLICY.read_text().replace('database = "tpch.duckdb"', served)
    text = text.replace("user_budget = { epsilon = 10.0, delta = 1e-5 }",
                        "user_budget = { epsilon = 1e9, delta = 0.5 }")  # fmt: skip
    text = text.replace("notebook_budget = { epsilon = 5.0, delta = 1e-5 }",
                        "notebook_budget = { epsilon = 1e9, delta = 0.5 }")  # fmt: skip
    (folder / "policy.toml").write_text(text)
    return Engine(load_policy(folder / "policy.toml"))


def measure(
    gate: Engine,
    raw: duckdb.DuckDBPyConnection,
    n: int,
    sql: str,
    runs: int,
    clip: float | None = None,
) -> dict:
    """One query's status, its noisy cells' median relative error, and latencies; with
    ``clip``, asked with that ``--clip`` share where the gate clips it."""
    truth = raw.execute(sql).fetchall()
    gate_s, raw_s, errors = [], [], []
    ask: dict = {"sql": sql, "epsilon": 1.0, "fresh": True}
    unclipped = None
    if clip is not None:
        try:  # a run not timed: whether the gate clips this query
            gate.query(f"bench-{n}-clip", {**ask, "clip": clip})
            ask["clip"] = clip
        except GateError as exc:
            unclipped = exc.message
    for i in range(runs):
        time.sleep(PAUSE_S)
        start = time.perf_counter()
        try:
            reply = gate.query(f"bench-{n}-{i}", ask)
        except GateError as exc:
            return {"query": n, "status": "refused", "message": exc.message}
        gate_s.append(time.perf_counter() - start)
        time.sleep(PAUSE_S)
        start = time.perf_counter()
        raw.execute(sql).fetchall()
        raw_s.append(time.perf_counter() - start)
        errors += _errors(reply, truth)
    exact = "exact" in reply
    return {
        "query": n,
        "unclipped": unclipped,
        "rows_per_person": ((reply.get("clip") or {}).get("rows") or {}).get("rows"),
        "status": "exact" if exact else "answered",
        "rows": len(reply["rows"]),
        "median_relative_error": statistics.median(errors) if errors else None,
        "gate_ms": 1000 * statistics.median(gate_s),
        "raw_ms": 1000 * statistics.median(raw_s),
    }


def _errors(reply: dict, truth: list[tuple]) -> list[float]:
    """Each noisy cell's relative error against the raw row with the same exact cells
    (the row's keys); a row the raw answer lacks (a key with no rows) is skipped."""
    noisy = [c is not None for c in reply["accuracy"]["columns"]]
    if not any(noisy):
        return []
    keys = [i for i, flag in enumerate(noisy) if not flag]
    by_key = {tuple(_plain(row[i]) for i in keys): row for row in truth}
    out = []
    for row in reply["rows"]:
        exact = by_key.get(tuple(_plain(row[i]) for i in keys))
        if exact is None:
            continue
        for i, flag in enumerate(noisy):
            if flag and row[i] is not None and exact[i] is not None:
                true = float(exact[i])
                out.append(abs(float(row[i]) - true) / max(abs(true), 1e-9))
    return out


def _plain(value: object) -> object:
    return value.isoformat() if hasattr(value, "isoformat") else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, nargs="+", default=[0.1], help="scale factors")
    parser.add_argument("--runs", type=int, default=20, help="fresh runs per query")
    parser.add_argument("--queries", default="", help="e.g. 1,6,13 (default: all 22)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument(
        "--engine", choices=["duckdb", "spark"], default="duckdb", help="the gate's engine"
    )
    parser.add_argument("--clip", type=float, help="ask each query with this --clip share")
    args = parser.parse_args()
    chosen = [int(q) for q in args.queries.split(",") if q] or list(range(1, 23))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    results = {}
    for sf in args.sf:
        data = database(sf)
        with tempfile.TemporaryDirectory(prefix="dpm-tpch-") as folder:
            gate = engine(data, Path(folder), args.engine)
            raw = duckdb.connect(str(data), read_only=True)
            texts = {n: (QUERIES / f"q{n:02d}.sql").read_text() for n in chosen}
            rows = [measure(gate, raw, n, texts[n], args.runs, args.clip) for n in chosen]
            gate.close()
        results[f"{sf:g}"] = rows
        _print(sf, rows, args.engine)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _print(sf: float, rows: list[dict], on: str) -> None:
    print(f"\nTPC-H SF {sf:g} on {on} (raw: DuckDB), ε = 1 per query")
    print(f"{'q':>3} {'status':9} {'rel. error':>10} {'gate ms':>8} {'raw ms':>7} {'ratio':>6}")
    for r in rows:
        if r["status"] == "refused":
            print(f"{r['query']:>3} refused   {r['message']}")
            continue
        err = r["median_relative_error"]
        shown = "-" if err is None else f"{err:.2%}"
        ratio = r["gate_ms"] / r["raw_ms"] if r["raw_ms"] else float("nan")
        note = f"  rows per person {r['rows_per_person']}" if r.get("rows_per_person") else ""
        note += f"  not clipped: {r['unclipped']}" if r.get("unclipped") else ""
        print(f"{r['query']:>3} {r['status']:9} {shown:>10} {r['gate_ms']:>8.1f} "
              f"{r['raw_ms']:>7.1f} {ratio:>6.2f}{note}")  # fmt: skip
    private = [r for r in rows if r["query"] not in PUBLIC_ONLY]
    answered = [r for r in private if r["status"] == "answered"]
    errors = [r["median_relative_error"] for r in answered if r["median_relative_error"]]
    ratios = [r["gate_ms"] / r["raw_ms"] for r in answered if r["raw_ms"]]
    print(
        f"customer queries answered: {len(answered)} of {len(private)}; median relative "
        f"error {statistics.median(errors):.2%}; median latency ratio "
        f"{statistics.median(ratios):.2f}×"
        if errors and ratios
        else f"customer queries answered: {len(answered)} of {len(private)}"
    )


if __name__ == "__main__":
    main()
