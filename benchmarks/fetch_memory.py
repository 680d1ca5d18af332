"""Peak memory of fetching a query's exact aggregates whole, columnar, or in batches.

    python benchmarks/fetch_memory.py --rows 1M --groups 100000

The gate releases at most 100,000 partitions per query; this measures what
holding that many exact rows costs, to decide whether ``engines/duckdb/database.py`` should
fetch in batches (pyarrow is not a dependency of the gate, so the batches are
``fetchmany``'s, and numpy's columns are the columnar option). Each way runs
in a fresh process (peak RSS is monotone), on the benchmark's ``visits`` table
grouped into ``--groups`` partitions with a count and a sum, as the gate's
rewritten SQL would return them.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

WAYS = ("none", "fetchall", "fetchnumpy", "batches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1M")
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--way", choices=WAYS, help="internal: run one way and print peak MB")
    args = parser.parse_args()
    from data import dataset, row_count

    folder = dataset(row_count(args.rows))
    if args.way:
        print(_peak_mb(folder, args.groups, args.way))
        return
    for way in WAYS:
        cmd = [sys.executable, __file__, "--rows", args.rows, "--groups", str(args.groups),
               "--way", way]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        print(f"{way}: peak {out} MB")


def _peak_mb(folder: Path, groups: int, way: str) -> str:
    """Run the grouped query and consume its result one way; ``none`` counts the
    groups inside DuckDB, so its peak is the scan's and the aggregation's alone."""
    import duckdb

    con = duckdb.connect(str(folder / "raw.duckdb"), read_only=True, config={"threads": 2})
    sql = f"SELECT pid % {groups} AS k, COUNT(*) AS n, SUM(income) AS s FROM visits GROUP BY k"
    if way == "none":
        kept = con.execute(f"SELECT COUNT(*) FROM ({sql})").fetchone()
    elif way == "fetchall":
        kept = con.execute(sql).fetchall()
    elif way == "fetchnumpy":
        kept = len(con.execute(sql).fetchnumpy()["k"])
    else:  # streamed: 10,000 rows at a time, each batch dropped before the next
        cur, kept = con.execute(sql), 0
        while batch := cur.fetchmany(10_000):
            kept += len(batch)
    assert kept
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"


if __name__ == "__main__":
    main()
