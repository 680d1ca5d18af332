"""Run the query set through one non-gate tool and print timings and answers as JSON.

Standalone on purpose (third-party imports only): the peers run in their own
virtual environments, where dpmagic is not installed. Usage:
``python tools.py TOOL DATA_FOLDER --reps N --epsilon E``, TOOL one of
``duckdb`` (raw, exact), ``smartnoise`` (SmartNoise SQL on DuckDB) or
``opendp-polars`` (OpenDP's Polars front end).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from queries import QUERIES

MAX_ROWS_PER_PERSON = 5
THREADS = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tool", choices=sorted(RUNNERS))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    out = RUNNERS[args.tool](args.folder, args.reps, args.epsilon)
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mb": kb / 1024, "queries": out}, default=float))


def _timed(run, reps: int) -> dict:
    """``run()`` returns rows as lists; refusals are reported, not raised."""
    seconds, answers = [], []
    for _ in range(reps + 1):  # the first run warms caches and is not counted
        start = time.perf_counter()
        try:
            rows = run()
        except Exception as exc:
            return {"status": f"refused: {type(exc).__name__}: {str(exc)[:120]}"}
        seconds.append(time.perf_counter() - start)
        answers.append(rows)
    return {"status": "ok", "seconds": seconds[1:], "answers": answers[1:]}


def run_duckdb(folder: Path, reps: int, epsilon: float) -> dict:
    import duckdb

    con = duckdb.connect(str(folder / "raw.duckdb"), read_only=True, config={"threads": THREADS})
    return {q.name: _timed(lambda q=q: [list(r) for r in con.execute(q.sql).fetchall()], reps)
            for q in QUERIES}  # fmt: skip


def run_smartnoise(folder: Path, reps: int, epsilon: float) -> dict:
    import duckdb
    import snsql

    con = duckdb.connect(str(folder / "raw.duckdb"), read_only=True, config={"threads": THREADS})
    int_col = {"type": "int"}
    meta = {
        "bench": {
            "main": {
                "visits": {
                    "row_privacy": False,
                    "max_ids": MAX_ROWS_PER_PERSON,
                    "censor_dims": False,
                    "pid": {"type": "int", "private_id": True},
                    "age": {"type": "int", "lower": 0, "upper": 100},
                    "income": {"type": "float", "lower": 0.0, "upper": 500000.0},
                    "state": int_col,
                    "diagnosis": int_col,
                },
                "persons": {
                    "row_privacy": False,
                    "max_ids": 1,
                    "censor_dims": False,
                    "pid": {"type": "int", "private_id": True},
                    "sex": int_col,
                    "enrolled": int_col,
                },
            }
        }
    }
    privacy = snsql.Privacy(epsilon=epsilon, delta=1e-6)
    reader = snsql.from_connection(con, engine="duckdb", privacy=privacy, metadata=meta)

    def run(sql: str) -> list:
        rows = reader.execute(sql.replace("FROM visits", "FROM main.visits"))
        return [list(r) for r in rows[1:]]  # the first row is the header

    return {q.name: _timed(lambda q=q: run(q.sql), reps) for q in QUERIES}


def run_opendp_polars(folder: Path, reps: int, epsilon: float) -> dict:
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    visits = pl.scan_parquet(folder / "visits.parquet")
    states = pl.Series("state", list(range(50)))
    diagnoses = pl.Series("diagnosis", list(range(20)))
    context = dp.Context.compositor(
        data=visits,
        privacy_unit=dp.unit_of(contributions=MAX_ROWS_PER_PERSON, identifier="pid"),
        privacy_loss=dp.loss_of(epsilon=epsilon * 10 * (reps + 1)),
        split_evenly_over=10 * (reps + 1),
        margins=[
            dp.polars.Margin(by=["state"], keys=states.to_frame(), max_length=10_000_000),
            dp.polars.Margin(by=["diagnosis"], keys=diagnoses.to_frame()),
            dp.polars.Margin(by=[], max_length=10_000_000),
        ],
    )
    income = pl.col("income").fill_null(0.0).dp
    plans = {
        "total count": lambda: context.query().select(dp.len().alias("n")),
        "count by state": lambda: context.query().group_by("state").agg(dp.len().alias("n")),
        "avg income by diagnosis": lambda: (
            context.query()
            .group_by("diagnosis")
            .agg(income.mean((0.0, 500000.0)).alias("avg_income"))
        ),
        "sum income, age > 65": lambda: (
            context.query()
            .filter(pl.col("age") > 65)
            .select(income.sum((0.0, 500000.0)).alias("total"))
        ),
        "median income": lambda: context.query().select(
            income.median([float(c) for c in range(0, 500001, 5000)]).alias("median_income")
        ),
    }

    def run(make) -> list:
        df = make().release().collect()
        return [list(r) for r in df.iter_rows()]

    out = {}
    for q in QUERIES:
        make = plans.get(q.name)
        out[q.name] = _timed(lambda m=make: run(m), reps) if make else {"status": "not expressed"}
    return out


RUNNERS = {
    "duckdb": run_duckdb,
    "smartnoise": run_smartnoise,
    "opendp-polars": run_opendp_polars,
}

if __name__ == "__main__":
    main()
