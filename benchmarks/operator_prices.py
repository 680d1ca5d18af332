"""Each row operator's price (``dpmagic/gate/sql/prices.py``) against its worst time.

For every operator a row expression may use on text, this script builds the
inputs that cost DuckDB the most (texts of 1-, 2-, 3- and 4-byte characters
and ligatures that grow when folded, at the column's ``max_length``; for
``LIKE`` and ``ILIKE`` patterns that make the matcher retry the rest of the
pattern at every position, as ``'%' + 'a' × m + '_b%'`` on a text of ``a``s,
with 1 to 5 ``%``), times one vector's worth of such rows on one thread, and
prints per operator the worst time a row measured, the gate's price for that
expression (the steps it adds to a row, read from the gate's own plan, times
``STEP_NS``), and the margin: price ÷ worst time. A margin below 1 is an
operator the gate underprices, and is printed as such (exit status 1).

    python benchmarks/operator_prices.py                 # max_length 1,024
    python benchmarks/operator_prices.py --length 4096 --reps 7

Not a test: times depend on the machine (its load is printed with them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import duckdb
from sqlglot import exp

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.policy import parse_policy
from dpmagic.gate.policy.values import STEP_NS
from dpmagic.gate.sql.pipeline import Asked, analyse
from dpmagic.gate.sql.work import steps_of

ROWS = 2048  # one DuckDB vector
# Characters whose bytes, case tables or folding make text work dearest.
FILLS = {"ascii": "a", "2-byte": "é", "3-byte": "ﬃ", "4-byte": "😀", "sharp s": "ß"}


def shapes(n: int) -> list[tuple[str, str, bool]]:
    """(label, expression over column ``s``, whether it is a condition) for each operator
    on its worst inputs; ``s`` holds ``n`` characters of one fill, ``t`` the same text."""
    out: list[tuple[str, str, bool]] = [
        ("UPPER", "UPPER(s)", False),
        ("LOWER", "LOWER(s)", False),
        ("TRIM", "TRIM(s)", False),
        ("SUBSTRING", f"SUBSTRING(s, 2, {n})", False),
        ("LEFT", f"LEFT(s, {n})", False),
        ("RIGHT", f"RIGHT(s, {n})", False),
        ("LENGTH", "LENGTH(s) > 0", True),
        ("||", "s || t", False),
        ("CONCAT", "CONCAT(s, t)", False),
        ("=", "s = t", True),
        ("<", "s < t", True),
        ("IN", "s IN (t, t || 'x', 'y' || t)", True),
        ("BETWEEN", "s BETWEEN t AND t", True),
        ("NULLIF", "NULLIF(s, t) IS NULL", True),
        ("TRY_CAST", "TRY_CAST(s AS DOUBLE) IS NULL", True),
        ("CASE", "(CASE WHEN s = t THEN s || t ELSE t END) < t", True),
    ]
    for m in (1, 5, 50, 200):
        for op in ("LIKE", "ILIKE"):
            out.append((f"{op} %a×{m}_b%", f"s {op} '%{'a' * m}_b%'", True))
            out.append((f"{op} %a×{m}b%", f"s {op} '%{'a' * m}b%'", True))
    for k in (2, 3, 5):
        for op in ("LIKE", "ILIKE"):
            out.append((f"{op} {k}×%a_c", f"s {op} '{'%a' * k}_c'", True))
            out.append((f"{op} {k}×%a%c", f"s {op} '{'%a' * k}%c'", True))
    out.append(("LIKE prefix", f"s LIKE '{'a' * 200}%'", True))
    return out


def measure(con: duckdb.DuckDBPyConnection, expr: str, condition: bool, reps: int) -> float:
    """Median ns a row of one vector costs, beyond reading the column."""
    work = f"count(*) FILTER (WHERE {expr})" if condition else f"sum(strlen({expr}))"

    def timed(select: str) -> float:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            con.execute(f"SELECT {select} FROM x").fetchall()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return max(0.0, timed(work) - timed("sum(strlen(s))")) / ROWS * 1e9


def price(dataset, expr: str, condition: bool) -> int:
    """The steps the gate prices one evaluation of ``expr`` at (``work.steps_of`` on the
    gate's own analysis of a query that reads it), its column reads included."""
    sql = f"SELECT COUNT(*) FROM x WHERE {expr if condition else f'LENGTH({expr}) >= 0'}"
    plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, PureAccountant())
    resolved = plan.checked.resolved
    tree = resolved.tree.args["where"].this
    if not condition:
        tree = next(tree.find_all(exp.Length)).this
    return steps_of(tree, resolved)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024, help="the column's max_length")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n = args.length
    raw = {
        "gate": {"response_quantum_ms": 100_000},  # no row cap: every shape gets a price
        "datasets": {
            "d": {
                "sources": {"x": "x.csv"},
                "user_budget": {"epsilon": 1e9},
                "max_unit_work": 2**62,
                "max_text_length": 64 * n,
                "tables": {
                    "x": {
                        "columns": {
                            "s": {"type": "str", "max_length": n},
                            "t": {"type": "str", "max_length": n},
                        }
                    }
                },
            }
        },
    }
    dataset = parse_policy(raw, Path("policy.toml")).dataset("d")
    con = duckdb.connect()
    con.execute("SET threads = 1")
    print(f"max_length {n:,}, {ROWS:,} rows a vector, one thread, median of {args.reps}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"{'operator':22} {'worst fill':>10} {'worst ns/row':>13} {'price':>9} "
          f"{'price ns':>10} {'margin':>7}")  # fmt: skip
    under = 0
    for label, expr, condition in shapes(n):
        worst, fill_of = 0.0, ""
        for fill_name, fill in FILLS.items():
            text = fill * n
            con.execute("CREATE OR REPLACE TABLE x AS SELECT $1 AS s, $1 AS t FROM range(2048)",
                        [text])  # fmt: skip
            ns = measure(con, expr, condition, args.reps)
            if ns > worst:
                worst, fill_of = ns, fill_name
        steps = price(dataset, expr, condition)
        margin = steps * STEP_NS / worst if worst else float("inf")
        flag = "  UNDERPRICED" if margin < 1 else ""
        under += margin < 1
        print(f"{label:22} {fill_of:>10} {worst:13,.0f} {steps:9,} {steps * STEP_NS:10,} "
              f"{margin:7.1f}{flag}")  # fmt: skip
    return 1 if under else 0


if __name__ == "__main__":
    sys.exit(main())
