"""Accuracy of dpmagic against its peers: RMSE, bias and interval coverage per query.

    python benchmarks/accuracy.py                       # dpmagic only, 2,000 repetitions
    python benchmarks/accuracy.py --peers --peer-reps 30

The workload: 100,000 visits of persons with 1 to 3 visits each (numpy PCG64,
fixed seed), age 0–100 and income 0–200,000 per visit, a state per person
(50 values), a diagnosis per visit (20 values). The policy bounds a person to
3 groups and 3 rows in each, so no row is left out: the exact answer of the
bounded data is the unbounded answer, against which every error is measured.
Each tool answers each query ``--reps`` times at ε = 1 (``--epsilon``) with the
same contribution bounds: dpmagic in-process through ``Engine.query`` (the
request path the server runs: plan, ledger debit, generated SQL on DuckDB,
noise, release), the peers each in a virtual environment of its own under
``benchmarks/.data/`` (``accuracy_peers.py``). Per query and tool it prints
the RMSE over all cells and repetitions, the bias (mean signed error), the
share of 95% intervals that hold the exact answer ("—" where a tool gives
none), and beside them the median time of one answer (dpmagic's in process,
without HTTP, as the peers run in theirs). Not a test: the figures are
estimates, with the sampling error of the repetitions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".data"
ROWS = 100_000
MAX_PARTITIONS, MAX_ROWS = 3, 3
SEED = 20_251_123

# name, SQL for dpmagic and DuckDB, SQL for SmartNoise, group keys, OpenDP aggregate.
QUERIES = [
    ("count", "SELECT COUNT(*) AS v FROM visits", None, (), "count"),
    (
        "count by state",
        "SELECT state, COUNT(*) AS v FROM visits GROUP BY state",
        None,
        ("state",),
        "count",
    ),
    ("sum income, age > 65", "SELECT SUM(income) AS v FROM visits WHERE age > 65", None, (), "sum"),
    ("avg income", "SELECT AVG(income) AS v FROM visits", None, (), "avg"),
    (
        "avg income by diagnosis",
        "SELECT diagnosis, AVG(income) AS v FROM visits GROUP BY diagnosis",
        None,
        ("diagnosis",),
        "avg",
    ),
    (
        "variance of income",
        "SELECT VAR_SAMP(income) AS v FROM visits",
        "SELECT VARIANCE(income) AS v FROM visits",
        (),
        None,
    ),
    (
        "stddev of income by diagnosis",
        "SELECT diagnosis, STDDEV_SAMP(income) AS v FROM visits GROUP BY diagnosis",
        "SELECT diagnosis, STDDEV(income) AS v FROM visits GROUP BY diagnosis",
        ("diagnosis",),
        None,
    ),
]
PEERS = {
    "smartnoise": ["smartnoise-sql", "duckdb"],
    "opendp-polars": ["opendp==0.16.0", "polars==1.36.1", "pyarrow", "numpy"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2_000, help="repetitions per query, dpmagic")
    parser.add_argument("--peers", action="store_true", help="also SmartNoise SQL and OpenDP")
    parser.add_argument("--peer-reps", type=int, default=30, help="repetitions per query, peers")
    parser.add_argument("--epsilon", type=float, default=1.0, help="ε per query, every tool")
    parser.add_argument("--only", help="run only the queries whose name contains this")
    args = parser.parse_args(argv)
    queries = [q for q in QUERIES if args.only is None or args.only in q[0]]

    folder = dataset()
    exact = _exact(folder, queries)
    results = {"dpmagic": _dpmagic(folder, queries, args.reps, args.epsilon)}
    if args.peers:
        for peer in PEERS:
            results[peer] = _peer(peer, folder, queries, args.peer_reps, args.epsilon)
    print(_header(args))
    print(_table(queries, exact, results))
    return 0


def dataset() -> Path:
    """The workload's data, generated once into ``benchmarks/.data/accuracy-100k``: a
    DuckDB file and a Parquet copy."""
    folder = CACHE / "accuracy-100k"
    if (folder / "visits.parquet").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(SEED))
    sizes = rng.integers(1, 4, ROWS)  # more persons than needed; cut at ROWS rows
    pid = np.repeat(np.arange(len(sizes)), sizes)[:ROWS]
    state_of = rng.integers(0, 50, len(sizes))
    data = {
        "pid": pid,
        "age": rng.integers(0, 101, ROWS),
        "income": np.round(rng.uniform(0, 200_000, ROWS), 2),
        "state": state_of[pid],
        "diagnosis": rng.integers(0, 20, ROWS),
    }
    con = duckdb.connect(str(folder / "raw.duckdb"))
    con.register("frame", _frame(data))
    con.execute(
        "CREATE TABLE visits AS SELECT pid::BIGINT AS pid, age::BIGINT AS age, "
        "income::DOUBLE AS income, state::BIGINT AS state, diagnosis::BIGINT AS diagnosis "
        "FROM frame"
    )
    con.execute(f"COPY visits TO '{folder / 'visits.parquet'}' (FORMAT parquet)")
    con.close()
    return folder


def _frame(data: dict[str, np.ndarray]):
    import pandas as pd

    return pd.DataFrame(data)


def _policy(folder: Path, state: Path) -> Path:
    text = f"""
[gate]
state_dir = "{state}"

[datasets.bench]
database = "{folder / "raw.duckdb"}"
privacy_unit = "pid"
max_partitions = {MAX_PARTITIONS}
max_rows_per_partition = {MAX_ROWS}
user_budget = {{ epsilon = 1e12 }}
notebook_budget = {{ epsilon = 1e12 }}

[datasets.bench.tables.visits.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
income = {{ type = "float", lower = 0.0, upper = 200000.0 }}
state = {{ type = "int", public_values = {list(range(50))} }}
diagnosis = {{ type = "int", public_values = {list(range(20))} }}
"""
    path = state / "policy.toml"
    path.write_text(text)
    return path


def _exact(folder: Path, queries: list) -> dict[str, dict[tuple, float]]:
    """Each query's exact answer on the unbounded data, by group key."""
    con = duckdb.connect(str(folder / "raw.duckdb"), read_only=True)
    out = {}
    for name, sql, _, keys, _ in queries:
        rows = con.execute(sql).fetchall()
        out[name] = {tuple(r[: len(keys)]): float(r[-1]) for r in rows}
    con.close()
    return out


def _dpmagic(folder: Path, queries: list, reps: int, epsilon: float) -> dict[str, dict]:
    """``reps`` fresh, charged answers per query through the gate's request path, and
    the time each took (in process: the engine, without HTTP)."""
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.policy import load_policy

    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dpm-accuracy-", dir=base) as state:
        engine = Engine(load_policy(_policy(folder, Path(state))))
        try:
            for name, sql, *_ in queries:
                runs, seconds = [], []
                for _ in range(reps):
                    body = {"sql": sql, "dataset": "bench", "epsilon": epsilon, "fresh": True}
                    started = time.perf_counter()
                    reply = engine.query("bench", body)
                    seconds.append(time.perf_counter() - started)
                    intervals = reply["accuracy"]["columns"][-1]["intervals"]
                    pairs = zip(reply["rows"], intervals, strict=True)
                    runs.append([[*row, *(iv or (None, None))] for row, iv in pairs])
                out[name] = {"runs": runs, "seconds": seconds}
                print(f"dpmagic: {name}: {reps} runs in {sum(seconds):.1f} s", file=sys.stderr)
        finally:
            engine.close()
    return out


def _peer(peer: str, folder: Path, queries: list, reps: int, epsilon: float) -> dict:
    spec = [
        {"name": n, "smartnoise_sql": sn or sql, "keys": list(k), "opendp": od,
         "where": "age > 65" in sql}
        for n, sql, sn, k, od in queries
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    started = time.perf_counter()
    done = subprocess.run(
        [str(_peer_python(peer)), str(HERE / "accuracy_peers.py"), peer, str(folder), f.name,
         "--reps", str(reps), "--epsilon", str(epsilon),
         "--max-partitions", str(MAX_PARTITIONS), "--max-rows", str(MAX_ROWS)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    os.unlink(f.name)
    print(f"{peer}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if done.returncode != 0:
        return {q[0]: {"status": f"failed: {done.stderr.strip()[-200:]}"} for q in queries}
    return json.loads(done.stdout)


def _peer_python(peer: str) -> Path:
    """The peer's own venv (created and filled on first use from the package index)."""
    venv = CACHE / f"venv-{peer}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEERS[peer]], check=True)
    return python


def _scores(exact: dict[tuple, float], runs: list, keys: int) -> tuple[float, float, float | None]:
    """RMSE and bias over every cell of every run, and the intervals' coverage; a cell
    a run leaves out is not scored (every tool here releases every public key)."""
    errors, covered, given = [], 0, 0
    for run in runs:
        for row in run:
            key, value, lo, hi = tuple(row[:keys]), row[keys], row[keys + 1], row[keys + 2]
            truth = exact.get(key)
            if truth is None or value is None:
                continue
            errors.append(float(value) - truth)
            if lo is not None and hi is not None:
                given += 1
                covered += lo <= truth <= hi
    e = np.asarray(errors)
    return float(math.sqrt(np.mean(e * e))), float(np.mean(e)), covered / given if given else None


def _table(queries: list, exact: dict, results: dict[str, dict]) -> str:
    tools = list(results)
    head = "| query | exact (mean of cells) | " + " | ".join(
        f"{t} RMSE | bias | 95% coverage | median time" for t in tools
    )
    lines = [head + " |", "|---" * (2 + 4 * len(tools)) + "|"]
    for name, _, _, keys, _ in queries:
        truth = exact[name]
        cells = [_fmt(sum(truth.values()) / len(truth))]
        for t in tools:
            answered = results[t].get(name) or {"status": "not run"}
            if "runs" not in answered:
                cells += [answered["status"].split(":")[0], "", "", ""]
                continue
            runs = answered["runs"]
            rmse, bias, cover = _scores(truth, runs, len(keys))
            cells += [_fmt(rmse), _fmt(bias), "—" if cover is None else f"{100 * cover:.1f}%",
                      f"{1000 * float(np.median(answered['seconds'])):.1f} ms"]  # fmt: skip
            cells[-4] += f" (n={len(runs)})" if t != "dpmagic" else ""
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _header(args: argparse.Namespace) -> str:
    load = os.getloadavg()[0]
    return (
        f"{ROWS:,} rows, persons with 1–3 rows; bounds {MAX_PARTITIONS} groups × {MAX_ROWS} rows; "
        f"ε = {args.epsilon}; dpmagic {args.reps} runs a query"
        + (f", peers {args.peer_reps}" if args.peers else "")
        + f"; load average {load:.2f}\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
