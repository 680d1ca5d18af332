"""What DuckDB's statistics are worth to the gate's SQL, and whether statistics that
say only what the policy says would recover it.

    python benchmarks/plan_statistics.py --rows 10M --reps 15

The gate plans every query without the data's statistics (docs/security.md, "Per-unit
work"): with them, one unit's values decided the plan's work for every other row. This
runs the visits workload's generated SQL (``benchmarks/visits.py``'s data and policy,
the SQL captured from an in-process engine) on the gate's own prepared copy, three
ways, raw DuckDB's SQL on the source file in turn with them:

- **as served**: planned without statistics (``database.STATISTICS_OPTIMIZERS`` off);
- **the data's statistics**: planned with them, as DuckDB would by default;
- **the policy's statistics**: planned with statistics, on a copy of the prepared
  file with three more rows in each private table (each column at its declared lower
  bound, at its upper bound, and NULL; a text at ``''`` and at ``max_length`` of the
  highest code point; a number without bounds at its type's ends; the rank at 0 and
  past the load cap, so no query keeps them), so that every column's smallest and
  largest value, and whether it holds a NULL, follow from the policy alone, whatever
  any unit's values. Only a measurement: the served gate has no such rows.

Each query runs once to warm up, then ``--reps`` times, each after a 50 ms pause
(as a user's queries come); medians, and each setting's ratio to raw DuckDB. Not a
test: the figures depend on the machine and its load, printed with them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from data import row_count  # noqa: E402
from queries import VISITS_QUERIES  # noqa: E402
from visits import _policy, visits_file  # noqa: E402

PAUSE_S = 0.05
HIGHEST = "\U0010ffff"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_count, default=10_000_000, help="1M, 10M or a number")
    parser.add_argument("--reps", type=int, default=15, help="timed runs per query (median)")
    args = parser.parse_args(argv)
    source = visits_file(args.rows)
    with tempfile.TemporaryDirectory(prefix="dpmagic-statistics-") as tmp:
        work = Path(tmp)
        sqls, prepared, dataset = _generated(source, work)
        bounded = work / "policy-statistics.duckdb"
        shutil.copy(prepared, bounded)
        _add_policy_rows(bounded, dataset)
        settings = {
            "raw DuckDB": (duckdb.connect(str(source), read_only=True), False),
            "as served": (attached(prepared, statistics_on=False), True),
            "the data's statistics": (attached(prepared, statistics_on=True), True),
            "the policy's statistics": (attached(bounded, statistics_on=True), True),
        }
        print(f"{args.rows:,} rows, {args.reps} runs of each, load {os.getloadavg()[0]:.2f}")
        print("| query | " + " | ".join(settings) + " |")
        print("|---" * (len(settings) + 1) + "|")
        for q in VISITS_QUERIES:
            times: dict[str, list[float]] = {name: [] for name in settings}
            for rep in range(args.reps + 1):
                for name, (con, generated) in settings.items():
                    time.sleep(PAUSE_S)
                    start = time.perf_counter()
                    if generated:
                        con.execute(*sqls[q.name]).fetchall()
                    else:
                        con.execute(q.sql).fetchall()
                    if rep:  # the first is the warm-up
                        times[name].append(time.perf_counter() - start)
            med = {name: statistics.median(t) * 1000 for name, t in times.items()}
            raw = med["raw DuckDB"]
            cells = [f"{m:.1f} ms" + ("" if n == "raw DuckDB" else f" ({m / raw:.2f}×)")
                     for n, m in med.items()]  # fmt: skip
            print(f"| {q.name} | " + " | ".join(cells) + " |")
        print(f"load {os.getloadavg()[0]:.2f}")
    return 0


def _generated(source: Path, work: Path) -> tuple[dict[str, tuple[str, dict | None]], Path, object]:
    """The gate's SQL for each query with the values its store binds to it (where its
    scans' first ranks end), its prepared file, and the dataset's policy."""
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.engines.duckdb import database
    from dpmagic.gate.policy.loading import load_policy

    policy_file = work / "policy.toml"
    policy_file.write_text(_policy(source, work))
    policy = load_policy(policy_file)
    seen: list[str] = []
    run = database.Database.run

    def noting(self: object, sql: str, *rest: object, **named: object) -> object:
        seen.append(sql)
        return run(self, sql, *rest, **named)  # type: ignore[arg-type]

    database.Database.run = noting  # type: ignore[method-assign]
    try:
        engine = Engine(policy)
        for q in VISITS_QUERIES:
            engine.query("bench", {"sql": q.sql, "epsilon": 1.0, "fresh": True})
        store = engine.databases["visits"]
        bound = [(sql, store.parameters(sql)) for sql in seen]  # type: ignore[attr-defined]
    finally:
        database.Database.run = run  # type: ignore[method-assign]
    names = [q.name for q in VISITS_QUERIES]
    prepared = next((work / "state").glob("visits.*.duckdb"))
    return dict(zip(names, bound, strict=True)), prepared, policy.datasets["visits"]


def attached(path: Path, statistics_on: bool) -> duckdb.DuckDBPyConnection:
    """``path`` read-only, as the gate attaches it, planned with or without statistics."""
    from dpmagic.gate.engines.duckdb.database import LOCKED, STATISTICS_OPTIMIZERS

    disabled = LOCKED["disabled_optimizers"] if statistics_on else STATISTICS_OPTIMIZERS
    con = duckdb.connect(":memory:", config={"disabled_optimizers": disabled})
    con.execute(f"ATTACH '{path}' AS prepared (READ_ONLY)")
    con.execute("USE prepared")
    return con


def _add_policy_rows(path: Path, dataset: object) -> None:
    """Three rows in each private table that set every column's statistics from the
    policy (the module's docstring)."""
    from dpmagic.gate.engines.ranking import RANK, ROWS, load_cap

    cap = load_cap(dataset)  # type: ignore[arg-type]
    con = duckdb.connect(str(path))
    try:
        for name, table in dataset.tables.items():  # type: ignore[attr-defined]
            described = con.execute(f'DESCRIBE "{name}"').fetchall()
            if RANK not in {c for c, *_ in described}:
                continue
            rows = []
            for end in ("low", "high"):
                values = []
                for column, sql_type, *_ in described:
                    declared = table.columns.get(column)
                    if column == RANK:
                        values.append("0" if end == "low" else str(cap + 1))
                    elif column.startswith(ROWS):
                        values.append("0" if end == "low" else str(cap))
                    else:
                        values.append(_end(declared, sql_type, end))
                rows.append(f"({', '.join(values)})")
            rows.append(f"({', '.join('NULL' for _ in described)})")
            con.execute(f'INSERT INTO "{name}" VALUES {", ".join(rows)}')
    finally:
        con.close()


def _end(column: object, sql_type: str, end: str) -> str:
    """A column's lowest or highest value the policy allows, as SQL."""
    if sql_type == "VARCHAR":
        return "''" if end == "low" else f"'{HIGHEST * column.max_length}'"  # type: ignore[attr-defined]
    bound = getattr(column, "lower" if end == "low" else "upper", None)
    if bound is not None:
        return repr(bound)
    if sql_type == "BIGINT":
        return str(-(2**63) if end == "low" else 2**63 - 1)
    raise ValueError(f"no policy end for a {sql_type} column")


if __name__ == "__main__":
    raise SystemExit(main())
