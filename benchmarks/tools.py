"""Run a query set through one non-gate tool and print timings and answers as JSON.

Standalone on purpose (third-party imports only): the peers run in their own
virtual environments, where dpmagic is not installed. Usage:
``python tools.py TOOL DATA --workload W --reps N --epsilon E``, TOOL one of
``duckdb`` (raw, exact), ``smartnoise`` (SmartNoise SQL on DuckDB) or
``opendp-polars`` (OpenDP's Polars front end on the Parquet files). DATA is the
``bench`` workload's folder (``raw.duckdb``, ``visits.parquet``, ``persons.parquet``)
or the ``visits`` workload's DuckDB file (its Parquet copy beside it). With
``--many GROUPS``, DATA is ``many_groups.py``'s DuckDB file (its Parquet copy
beside it) and the tool answers its one query, ``MANY_SQL``, with GROUPS public keys.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from queries import WORKLOADS, Workload

THREADS = 2
MANY_SQL = "SELECT k, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY k"
MANY_ROWS = 2  # rows a person has in many_groups.py's table, all in one group
MANY_UPPER = 999  # x's declared upper bound (its lower is 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tool", choices=sorted(RUNNERS))
    parser.add_argument("data", type=Path)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="bench")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--many", type=int, help="many_groups.py's query, with this many keys")
    args = parser.parse_args()
    if args.many:
        run = MANY_RUNNERS[args.tool](args.data, args.many, args.epsilon)
        out = {"many groups": _timed(run, args.reps)}
    else:
        out = RUNNERS[args.tool](WORKLOADS[args.workload], args.data, args.reps, args.epsilon)
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
            return {"status": f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"}
        seconds.append(time.perf_counter() - start)
        answers.append(rows)
    return {"status": "ok", "seconds": seconds[1:], "answers": answers[1:]}


def _files(w: Workload, data: Path) -> tuple[Path, Path]:
    """The workload's DuckDB file and its visits table as Parquet."""
    if w.name == "bench":
        return data / "raw.duckdb", data / "visits.parquet"
    return data, data.with_suffix(".parquet")


def run_duckdb(w: Workload, data: Path, reps: int, epsilon: float) -> dict:
    import duckdb

    database = str(_files(w, data)[0])
    con = duckdb.connect(database, read_only=True, config={"threads": THREADS})
    return {q.name: _timed(lambda q=q: [list(r) for r in con.execute(q.sql).fetchall()], reps)
            for q in w.queries}  # fmt: skip


def run_smartnoise(w: Workload, data: Path, reps: int, epsilon: float) -> dict:
    import duckdb
    import snsql

    database = str(_files(w, data)[0])
    con = duckdb.connect(database, read_only=True, config={"threads": THREADS})
    key = {"type": w.key_type}
    upper = w.income_upper if w.income_type == "float" else int(w.income_upper)
    tables = {
        "visits": {
            "row_privacy": False,
            "max_ids": w.max_rows,
            "censor_dims": False,
            w.unit: {"type": "int", "private_id": True},
            "age": {"type": "int", "lower": 0, "upper": 100},
            "income": {"type": w.income_type, "lower": 0 * upper, "upper": upper},
            "state": key,
            "diagnosis": key,
        }
    }
    if w.name == "bench":
        tables["persons"] = {
            "row_privacy": False,
            "max_ids": 1,
            "censor_dims": False,
            "pid": {"type": "int", "private_id": True},
            "sex": {"type": "int"},
            "enrolled": {"type": "int"},
        }
    meta = {"bench": {"main": tables}}
    privacy = snsql.Privacy(epsilon=epsilon, delta=1e-6)
    # SmartNoise has no DuckDB reader; its PostgreSQL one speaks a dialect DuckDB accepts.
    reader = snsql.from_connection(
        DuckDbApi(con), engine="postgres", privacy=privacy, metadata=meta
    )

    def run(sql: str) -> list:
        sql = sql.replace("FROM visits", "FROM main.visits").replace(
            "JOIN persons", "JOIN main.persons"
        )
        rows = reader.execute(sql)
        return [list(r) for r in rows[1:]]  # the first row is the header

    return {q.name: _timed(lambda q=q: run(q.sql), reps) for q in w.queries}


class DuckDbApi:
    """The DB-API surface SmartNoise's PostgreSQL reader uses, over a DuckDB connection."""

    def __init__(self, con) -> None:
        self.con = con

    def cursor(self):
        return _Cursor(self.con.cursor())

    def commit(self) -> None:
        """Reads only: nothing to commit."""

    def rollback(self) -> None:
        """Reads only: nothing to roll back."""


class _Cursor:
    def __init__(self, cur) -> None:
        self.cur = cur
        self.description = None

    def execute(self, sql: str) -> None:
        # DuckDB refuses a volatile window order; a hash of the row sorts the same way.
        sql = re.sub(r"ORDER BY RANDOM \( \)", "ORDER BY hash(COLUMNS(*))", sql, flags=re.I)
        self.cur.execute(sql)
        self.description = self.cur.description

    def __iter__(self):
        return iter(self.cur.fetchall())


def run_opendp_polars(w: Workload, data: Path, reps: int, epsilon: float) -> dict:
    """OpenDP's Context over a Polars LazyFrame. The unit is a person and
    ``truncate_per_group(w.max_rows)`` keeps at most that many of their rows, as the
    gate's bound does. Group keys are public (``with_keys``, like the gate's
    ``public_values``); sums and means need a public bound on the row count
    (``max_length``: ``w.max_rows`` per person). It has no joins, so the join is
    reported unsupported, not attempted."""
    import numpy as np
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    visits = pl.scan_parquet(_files(w, data)[1])
    persons = visits.select(pl.col(w.unit).n_unique()).collect().item()
    max_length = w.max_rows * persons  # the person count is taken as public
    keys = {k: visits.select(pl.col(k).unique().sort()).collect() for k in ("state", "diagnosis")}
    top = w.income_upper
    candidates = [float(x) for x in np.linspace(0, top, 1_001)]
    income = pl.col("income").cast(pl.Float64).fill_null(0.0).clip(0.0, top)
    # An integer income is summed as integers, as the gate sums it.
    summed, bounds = (income, (0.0, top))
    if w.income_type == "int":
        column = pl.col("income").cast(pl.Int64)  # OpenDP refuses an i32 sum as overflowing
        summed, bounds = column.fill_null(0).clip(0, int(top)), (0, int(top))

    def query():
        context = dp.Context.compositor(
            data=visits,
            privacy_unit=dp.unit_of(contributions=1, identifier=pl.col(w.unit)),
            privacy_loss=dp.loss_of(epsilon=epsilon),
            split_evenly_over=1,
            margins=[dp.polars.Margin(by=[], max_length=max_length)],
        )
        return context.query().truncate_per_group(w.max_rows)

    def grouped(by: list[str], agg) -> list:
        key_frame = keys[by[0]] if len(by) == 1 else keys[by[0]].join(keys[by[1]], how="cross")
        q = query().group_by(by).agg(agg).with_keys(key_frame)
        return q.release().collect().sort(by).rows()

    def scalar(agg) -> list:
        return [list(query().select(agg).release().collect().row(0))]

    plans = {
        "total count": lambda: scalar(dp.len(signed=True)),
        "count by state": lambda: grouped(["state"], dp.len(signed=True)),
        "avg income by diagnosis": lambda: grouped(["diagnosis"], income.dp.mean((0.0, top))),
        "sum income, age > 65": lambda: [
            list(
                query()
                .filter(pl.col("age") > 65)
                .select(summed.dp.sum(bounds))
                .release()
                .collect()
                .row(0)
            )
        ],
        "count by state × diagnosis": lambda: grouped(["state", "diagnosis"], dp.len(signed=True)),
        "median income": lambda: scalar(income.dp.median(candidates)),
    }
    plans["sum income where age > 65"] = plans["sum income, age > 65"]  # visits' name
    return {
        q.name: _timed(plans[q.name], reps)
        if q.name in plans
        else {"status": "unsupported: no joins in OpenDP's Polars front end"}
        for q in w.queries
    }


def many_duckdb(data: Path, groups: int, epsilon: float):
    """Raw DuckDB's exact answer to ``MANY_SQL`` (for reference)."""
    import duckdb

    con = duckdb.connect(str(data), read_only=True, config={"threads": THREADS})
    return lambda: [list(r) for r in con.execute(MANY_SQL).fetchall()]


def many_smartnoise(data: Path, groups: int, epsilon: float):
    """SmartNoise SQL on the same DuckDB file: a person's rows bounded to ``MANY_ROWS``
    (the reach the gate's policy gives one person: one group, two rows), ``x`` in
    ``[0, MANY_UPPER]``, the query's whole cost ``epsilon``. It releases the keys it
    finds (``censor_dims`` off: every key of this table has rows), not a declared
    list."""
    import duckdb
    import snsql

    con = duckdb.connect(str(data), read_only=True, config={"threads": THREADS})
    table = {
        "row_privacy": False,
        "max_ids": MANY_ROWS,
        "censor_dims": False,
        "pid": {"type": "int", "private_id": True},
        "k": {"type": "int"},
        "x": {"type": "int", "lower": 0, "upper": MANY_UPPER},
    }
    sql = MANY_SQL.replace("FROM t", "FROM main.t")

    def reader(per_column: float):
        return snsql.from_connection(
            DuckDbApi(con),
            engine="postgres",
            privacy=snsql.Privacy(epsilon=per_column, delta=1e-6),
            metadata={"bench": {"main": {"t": table}}},
        )

    # SmartNoise spends its ε on each aggregate (2 here): given ε/2 each, the query
    # costs ε in all, as the gate's does.
    spent, _ = reader(epsilon).get_privacy_cost(sql)
    answering = reader(epsilon * epsilon / float(spent))
    return lambda: [list(r) for r in answering.execute(sql)[1:]]  # the first row: the header


def many_opendp_polars(data: Path, groups: int, epsilon: float):
    """OpenDP's Context over the Parquet copy: ``truncate_per_group(MANY_ROWS)`` per
    person, the keys ``0 … groups-1`` declared public (``with_keys``), the sum bounded
    in ``[0, MANY_UPPER]``, the row count taken as public (``max_length``)."""
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    frame = pl.scan_parquet(data.with_suffix(".parquet"))
    persons = frame.select(pl.col("pid").n_unique()).collect().item()
    keys = pl.DataFrame({"k": list(range(groups))}, schema={"k": pl.Int64})
    x = pl.col("x").cast(pl.Int64).fill_null(0).clip(0, MANY_UPPER)

    def run() -> list:
        context = dp.Context.compositor(
            data=frame,
            privacy_unit=dp.unit_of(contributions=1, identifier=pl.col("pid")),
            privacy_loss=dp.loss_of(epsilon=epsilon),
            split_evenly_over=1,
            margins=[dp.polars.Margin(by=[], max_length=MANY_ROWS * persons)],
        )
        query = context.query().truncate_per_group(MANY_ROWS).group_by("k")
        agg = query.agg(dp.len(signed=True).alias("n"), x.dp.sum((0, MANY_UPPER)).alias("s"))
        return agg.with_keys(keys).release().collect().sort("k").rows()

    return run


MANY_RUNNERS = {
    "duckdb": many_duckdb,
    "smartnoise": many_smartnoise,
    "opendp-polars": many_opendp_polars,
}

RUNNERS = {
    "duckdb": run_duckdb,
    "smartnoise": run_smartnoise,
    "opendp-polars": run_opendp_polars,
}

if __name__ == "__main__":
    main()
