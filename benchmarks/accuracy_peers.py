"""Answer the accuracy benchmark's queries with one peer, many times, as JSON.

Standalone on purpose (third-party imports only): each peer runs in a virtual
environment of its own, where dpmagic is not installed. Usage:
``python accuracy_peers.py TOOL DATA_FOLDER QUERIES_JSON --reps N --epsilon E
--max-partitions K --max-rows M``. Prints ``{query name: {"runs": [rep, …],
"seconds": [time, …]}}``, each rep a list of ``[keys…, value, low, high]`` rows
(``low``/``high`` null where the tool gives no interval) and the time it took, or
``{"status": …}`` for a query the tool refuses.

The contribution bounds are the gate's: a person's rows in at most K groups
and M rows in each, so an L1 sensitivity of K·M rows in a grouped query and M
in an ungrouped one. SmartNoise SQL spends its ε on each noisy column (an AVG is charged 2ε), so it
is given the ε that makes the whole query cost the same; it gives no
intervals (1.0.10 removed them) and bounds a
person's rows in all (``max_ids``),
so it gets K·M for a grouped query and M otherwise; so does OpenDP's Polars
front end (``truncate_per_group`` over a person's rows). The sensitivities are
then the gate's (the data has at most 3 rows a person, so nothing is left out
by any tool).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools import DuckDbApi

ALPHA = 0.05


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tool", choices=sorted(RUNNERS))
    parser.add_argument("folder", type=Path)
    parser.add_argument("queries", type=Path)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--max-partitions", type=int, default=3)
    parser.add_argument("--max-rows", type=int, default=3)
    args = parser.parse_args()
    queries = json.loads(args.queries.read_text())
    out = RUNNERS[args.tool](args, queries)
    json.dump(out, sys.stdout, default=float)


def _repeat(run, reps: int) -> dict:
    runs, seconds = [], []
    try:
        for _ in range(reps):
            start = time.perf_counter()
            runs.append(run())
            seconds.append(time.perf_counter() - start)
    except Exception as exc:  # a refusal or an unsupported construct, reported
        return {"status": f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"}
    return {"runs": runs, "seconds": seconds}


def run_smartnoise(args: argparse.Namespace, queries: list[dict]) -> dict:
    import duckdb
    import snsql

    con = duckdb.connect(str(args.folder / "raw.duckdb"), read_only=True)

    def reader(max_ids: int, epsilon: float):
        meta = {
            "bench": {
                "main": {
                    "visits": {
                        "row_privacy": False,
                        "max_ids": max_ids,
                        "censor_dims": False,
                        "pid": {"type": "int", "private_id": True},
                        "age": {"type": "int", "lower": 0, "upper": 100},
                        "income": {"type": "float", "lower": 0.0, "upper": 200000.0},
                        "state": {"type": "int"},
                        "diagnosis": {"type": "int"},
                    }
                }
            }
        }
        privacy = snsql.Privacy(epsilon=epsilon, delta=1e-6)
        return snsql.from_connection(
            DuckDbApi(con), engine="postgres", privacy=privacy, metadata=meta
        )

    def run(q: dict) -> list:
        sql = q["smartnoise_sql"].replace("FROM visits", "FROM main.visits")
        max_ids = args.max_rows * (args.max_partitions if q["keys"] else 1)
        # SmartNoise spends its ε on every noisy column it computes (an AVG costs 2ε):
        # scaled down so that the whole query costs the ε the others are given.
        cost = reader(max_ids, args.epsilon).get_privacy_cost(sql)[0]
        r = reader(max_ids, args.epsilon * args.epsilon / cost)
        # Its intervals (``execute_with_accuracy``) are gone from this version: "Simple
        # accuracy has been removed".
        return [[*row, None, None] for row in r.execute(sql)[1:]]  # the first row: header

    return {q["name"]: _repeat(lambda q=q: run(q), args.reps) for q in queries}


def run_opendp_polars(args: argparse.Namespace, queries: list[dict]) -> dict:
    """OpenDP's Context over a Polars LazyFrame, the person (``pid``) as identifier.
    The mean needs a public bound on the row count: 3 rows a person, the person
    count taken as public. Intervals from ``summarize(alpha)``, for a count or a
    sum (a mean's is not given)."""
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    visits = pl.scan_parquet(args.folder / "visits.parquet")
    persons = visits.select(pl.col("pid").n_unique()).collect().item()
    max_length = args.max_rows * args.max_partitions * persons
    keys = {k: visits.select(pl.col(k).unique().sort()).collect() for k in ("state", "diagnosis")}
    income = pl.col("income").fill_null(0.0).clip(0.0, 200_000.0)

    def query(by: list[str]):
        context = dp.Context.compositor(
            data=visits,
            privacy_unit=dp.unit_of(contributions=1, identifier=pl.col("pid")),
            privacy_loss=dp.loss_of(epsilon=args.epsilon),
            split_evenly_over=1,
            # The row count bounds each group's too, taken as public like the gate's keys.
            margins=[
                dp.polars.Margin(by=b, max_length=max_length) for b in [[], by][: 1 + bool(by)]
            ],
        )
        # A person's rows over all groups, as SmartNoise's ``max_ids``: the same L1 bound
        # (``truncate_num_groups`` with one key fails in this version's Polars plan).
        return context.query().truncate_per_group(
            args.max_rows * (args.max_partitions if by else 1)
        )

    aggregates = {
        "count": lambda: dp.len(signed=True),
        "sum": lambda: income.dp.sum((0.0, 200_000.0)),
        "avg": lambda: income.dp.mean((0.0, 200_000.0)),
    }

    def run(q: dict) -> list:
        by = list(q["keys"])
        lazy = query(by)
        if q.get("where"):
            lazy = lazy.filter(pl.col("age") > 65)
        agg = aggregates[q["opendp"]]().alias("v")
        lazy = lazy.group_by(by).agg(agg).with_keys(keys[by[0]]) if by else lazy.select(agg)
        half = None
        if q["opendp"] != "avg":
            summary = lazy.summarize(alpha=ALPHA)
            half = float(summary["accuracy"][0])
        frame = lazy.release().collect()
        rows = frame.sort(by).rows() if by else frame.rows()
        out = []
        for row in rows:
            value = row[-1]
            bounds = (None, None) if half is None else (value - half, value + half)
            out.append([*row[:-1], value, *bounds])
        return out

    return {
        q["name"]: _repeat(lambda q=q: run(q), args.reps)
        if q.get("opendp")
        else {"status": "unsupported: no variance in OpenDP's Polars front end"}
        for q in queries
    }


RUNNERS = {"smartnoise": run_smartnoise, "opendp-polars": run_opendp_polars}

if __name__ == "__main__":
    main()
