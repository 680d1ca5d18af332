"""Cells a reader could take for facts: noise-dominated but unflagged, or flagged but sound.

    python benchmarks/misleading_cells.py                # 200 runs of each query
    python benchmarks/misleading_cells.py --runs 50 --json out.json

Data the project did not generate: statsmodels' bundled ``fair`` survey (Fair
1978, "A theory of extramarital affairs": 6,366 women, 9 columns; ``pip install
-e '.[bench]'``), one privacy unit per row, so contribution bounding leaves
nothing out. A real gate process serves it over a unix socket (padding off);
each query of ``QUERIES`` (counts, sums, averages, variances, medians, MIN/MAX,
arithmetic, HAVING; empty and small groups; tight and loose bounds) runs
``--runs`` times at ε = 0.5 (``--epsilon``), fresh each time, through
``dpmagic.client.http_gate``; each noisy cell is read as the user reads it, through
``DPResult`` (``noise_dominates``, ``accuracy``).

The truth is raw DuckDB's answer to the same SQL on the same rows (no HAVING:
every released group's true value). For each cell the noise's own size at the
true values is measured from the runs themselves, whatever the gate says: the
central 95% range of the released values (a value with a declared range), the
95th percentile of ``|released − true|`` (counts, sums, arithmetic), or of how
far the released value's true percentile lies from the quantile's level
(quantiles; and the band the mechanism's 95% rank radius allows at the true
group size, whichever is wider). The rule of docs/accuracy.md ("When noise
dominates") is then applied
to the truth: noise dominates a true value when that 95% range covers at least
half of its declared range, when that error is at least ``|true|``, or when the
percentile band it allows covers at least half of the group (an empty group's
average or quantile is noise whatever it shows). With a margin, since the gate
sees only noisy values (docs/accuracy.md states it): *clearly dominated* is 1.5
times past the threshold (error ≥ 1.5·|true|; 95% range ≥ 0.75 of the range;
band ≥ 0.75), *clearly sound* a fifth of it (error ≤ |true|/5; range ≤ 1/10;
band ≤ 1/10); between them lies a grey zone, counted but not judged. A fifth:
a flagged cell whose interval holds the truth has ``|true| ≤ 3h`` (``h`` its
half-width), an expression's interval (Bonferroni) is up to 1.3 times its
noise's 95% error, and that error is itself measured from the runs.

Counted over all runs: cells whose interval missed the truth (the 5% a 95%
interval allows; judged separately, not as a flag error), and among the others
**unflagged but clearly dominated** and **flagged but clearly sound**: both
should be 0. A quantile's interval in the column's units is checked apart, against
the group's true quantile. Cells the gate could not judge (``None``: a quantile with no count
of its argument in the query, an expression with no interval) are shown as
"noise may dominate" and counted apart. A benchmark and, with fewer runs, a
system test (tests/system/test_misleading_cells.py).
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
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

EPSILON = 0.5
RUNS = 200
MARGIN_DOMINATED = 1.5
MARGIN_SOUND = 5.0
TABLE = "affairs"


@dataclass(frozen=True)
class Judge:
    """How the truth is judged: ``zero`` (counts, sums, arithmetic), ``range`` (a value
    with declared bounds ``lo``, ``hi``), ``quantile`` (of ``column`` at ``level``,
    declared within ``lo``, ``hi``)."""

    kind: str
    lo: float = 0.0
    hi: float = 0.0
    column: str = ""
    level: float = 0.5


ZERO = Judge("zero")


@dataclass(frozen=True)
class Query:
    name: str
    sql: str
    keys: int  # the leading group-key columns
    judges: dict[str, Judge]
    truth_sql: str = ""  # the SQL raw DuckDB answers (default: ``sql``)
    empty: str = "zero"  # a group with no row: "zero" (its counts and sums are 0)


# Declared bounds: tight (the data's own range) and loose (far wider).
AGE = (17.5, 42.0)
AGE_LOOSE = (0.0, 120.0)
AFFAIRS = (0.0, 57.6)
YEARS = (0.0, 23.0)

QUERIES: tuple[Query, ...] = (
    Query("count by occupation", "SELECT occupation, COUNT(*) AS n FROM affairs "
          "GROUP BY occupation", 1, {"n": ZERO}),
    Query("count by educ (6 of 12 groups empty)", "SELECT educ, COUNT(*) AS n FROM affairs "
          "GROUP BY educ", 1, {"n": ZERO}),
    Query("count, small cell", "SELECT COUNT(*) AS n FROM affairs WHERE occupation = 1 "
          "AND educ = 20", 0, {"n": ZERO}),
    Query("avg age, 41 rows (tight bounds)", "SELECT AVG(age) AS a FROM affairs "
          "WHERE occupation = 1", 0, {"a": Judge("range", *AGE)}),
    Query("avg age by occupation (tight)", "SELECT occupation, AVG(age) AS a, COUNT(*) AS n "
          "FROM affairs GROUP BY occupation", 1, {"a": Judge("range", *AGE), "n": ZERO}),
    Query("avg age by occupation (loose)", "SELECT occupation, AVG(age_loose) AS a "
          "FROM affairs GROUP BY occupation", 1, {"a": Judge("range", *AGE_LOOSE)}),
    Query("avg years married by educ (empty groups)", "SELECT educ, AVG(yrs_married) AS a "
          "FROM affairs GROUP BY educ", 1, {"a": Judge("range", *YEARS)}),
    Query("avg affairs by rating", "SELECT rate_marriage, AVG(affairs) AS a FROM affairs "
          "GROUP BY rate_marriage", 1, {"a": Judge("range", *AFFAIRS)}),
    Query("sum of children by religiousness", "SELECT religious, SUM(children) AS s "
          "FROM affairs GROUP BY religious", 1, {"s": ZERO}),
    Query("sum of affairs by educ", "SELECT educ, SUM(affairs) AS s FROM affairs "
          "GROUP BY educ", 1, {"s": ZERO}),
    Query("median affairs by educ, no count", "SELECT educ, MEDIAN(affairs) AS m FROM affairs "
          "GROUP BY educ", 1, {"m": Judge("quantile", *AFFAIRS, column="affairs")}),
    Query("median affairs by educ, with its count", "SELECT educ, COUNT(affairs) AS n, "
          "MEDIAN(affairs) AS m FROM affairs GROUP BY educ", 1,
          {"n": ZERO, "m": Judge("quantile", *AFFAIRS, column="affairs")}),
    Query("median, min, max of age by occupation", "SELECT occupation, COUNT(age) AS n, "
          "MEDIAN(age) AS m, MIN(age) AS lo, MAX(age) AS hi FROM affairs GROUP BY occupation",
          1, {"n": ZERO, "m": Judge("quantile", *AGE, column="age"),
              "lo": Judge("quantile", *AGE, column="age", level=0.0),
              "hi": Judge("quantile", *AGE, column="age", level=1.0)}),
    Query("stddev of age, variance of years by occupation", "SELECT occupation, "
          "STDDEV(age) AS sd, VAR_POP(yrs_married) AS v FROM affairs GROUP BY occupation", 1,
          {"sd": Judge("range", 0.0, (AGE[1] - AGE[0]) / 2),
           "v": Judge("range", 0.0, ((YEARS[1] - YEARS[0]) / 2) ** 2)}),
    Query("avg age minus 30 (arithmetic)", "SELECT occupation, AVG(age) - 30 AS d "
          "FROM affairs GROUP BY occupation", 1, {"d": ZERO}),
    Query("affairs per woman (sum over count)", "SELECT educ, SUM(affairs) / COUNT(*) AS r "
          "FROM affairs GROUP BY educ", 1, {"r": ZERO}),
    Query("HAVING over a noisy count", "SELECT educ, COUNT(*) AS n FROM affairs GROUP BY educ "
          "HAVING COUNT(*) > 20", 1, {"n": ZERO},
          truth_sql="SELECT educ, COUNT(*) AS n FROM affairs GROUP BY educ"),
)  # fmt: skip


def fair() -> pd.DataFrame:
    """statsmodels' ``fair`` survey, one privacy unit (``pid``) per row, the group keys as
    whole numbers, and ``age_loose``: age again, to be declared with loose bounds."""
    try:
        from statsmodels.datasets import fair as source
    except ImportError:
        raise SystemExit("needs statsmodels: pip install -e '.[bench]'") from None
    data = source.load_pandas().data
    out = pd.DataFrame({"pid": np.arange(len(data))})
    for key in ("occupation", "educ", "rate_marriage", "religious"):
        out[key] = data[key].astype(int)
    for value in ("age", "yrs_married", "children", "affairs"):
        out[value] = data[value].astype(float)
    out["age_loose"] = out["age"]
    return out


def policy(csv: Path, state: Path) -> str:
    return f"""
[gate]
state_dir = "{state}"
response_quantum_ms = 0

[datasets.fair]
sources = {{ {TABLE} = "{csv}" }}
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = {{ epsilon = 1e12 }}
notebook_budget = {{ epsilon = 1e12 }}

[datasets.fair.tables.{TABLE}.columns]
pid = {{ type = "int" }}
occupation = {{ type = "int", public_values = [1, 2, 3, 4, 5, 6] }}
educ = {{ type = "int", lower = 9, upper = 20 }}
rate_marriage = {{ type = "int", public_values = [1, 2, 3, 4, 5] }}
religious = {{ type = "int", public_values = [1, 2, 3, 4] }}
age = {{ type = "float", lower = {AGE[0]}, upper = {AGE[1]} }}
age_loose = {{ type = "float", lower = {AGE_LOOSE[0]}, upper = {AGE_LOOSE[1]} }}
yrs_married = {{ type = "float", lower = {YEARS[0]}, upper = {YEARS[1]} }}
children = {{ type = "float", lower = 0, upper = 5.5 }}
affairs = {{ type = "float", lower = {AFFAIRS[0]}, upper = {AFFAIRS[1]} }}
"""


@dataclass
class Tally:
    cells: int = 0
    missed: int = 0  # the interval (or band) did not hold the truth
    units_missed: int = 0  # a quantile's interval in units missed its true quantile
    unjudged: int = 0  # the gate said it cannot tell ("noise may dominate")
    grey: int = 0
    unflagged_dominated: int = 0
    flagged_sound: int = 0
    flagged: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in ("cells", "missed", "units_missed", "unjudged", "grey",
                     "unflagged_dominated", "flagged_sound", "flagged"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.examples += other.examples[: max(0, 5 - len(self.examples))]


def start_gate(folder: Path, data: pd.DataFrame) -> tuple[subprocess.Popen, str]:
    csv = folder / "fair.csv"
    data.to_csv(csv, index=False)
    (folder / "policy.toml").write_text(policy(csv, folder / "state"))
    address = f"unix:{folder / 'gate.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "serve", "--policy", str(folder / "policy.toml"),
         "--listen", address],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("DPMAGIC_")},
    )  # fmt: skip
    for line in proc.stdout or ():
        if "listening" in line:
            return proc, address
    raise RuntimeError("the gate exited before listening")


def run(runs: int = RUNS, epsilon: float = EPSILON, queries=QUERIES) -> dict[str, Tally]:
    """Each query ``runs`` times through a real gate; a tally per query."""
    from dpmagic.client.http_gate import Gate

    data = fair()
    con = duckdb.connect()
    con.register(TABLE, data)
    out = {}
    with tempfile.TemporaryDirectory(prefix="dpm-mc-") as work:
        proc, address = start_gate(Path(work), data)
        try:
            client = Gate(address, timeout=120)
            for q in queries:
                results = [client.query(q.sql, epsilon=epsilon, fresh=True) for _ in range(runs)]
                out[q.name] = judge(q, results, con, data)
        finally:
            proc.terminate()
            proc.wait(30)
    return out


def judge(q: Query, results: list, con: duckdb.DuckDBPyConnection, data: pd.DataFrame) -> Tally:
    """The tally of one query's runs against raw DuckDB's truth."""
    truth_frame = con.execute(q.truth_sql or q.sql).df()
    columns = list(truth_frame.columns)
    truth = {
        tuple(row[: q.keys]): dict(zip(columns[q.keys :], row[q.keys :], strict=True))
        for row in truth_frame.itertuples(index=False, name=None)
    }
    # Each cell's released values over the runs, to measure the noise at the truth.
    seen: dict[tuple, list[dict]] = defaultdict(list)
    for result in results:
        for r, row in enumerate(result.rows):
            key = tuple(row[: q.keys])
            for column, j in q.judges.items():
                c = result.columns.index(column)
                seen[(key, column)].append(_cell(result, r, c, row[c], j))
    tally = Tally()
    for (key, column), cells in seen.items():
        j = q.judges[column]
        true = (truth.get(key) or {}).get(column)
        if isinstance(true, float) and math.isnan(true):
            true = None
        if true is None and j.kind == "zero" and q.empty == "zero" and key not in truth:
            true = 0.0
        group = _group(data, q, key)
        verdict = _truth_verdict(j, true, cells, group)
        for cell in cells:
            tally.cells += 1
            flag = cell["flag"]
            if flag is None:
                tally.unjudged += 1
                continue
            tally.flagged += bool(flag)
            tally.units_missed += not _holds_in_units(j, cell, group)
            if not _holds(j, true, cell, group):
                tally.missed += 1
                continue
            if verdict == "grey":
                tally.grey += 1
            elif verdict == "dominated" and not flag:
                tally.unflagged_dominated += 1
                tally.examples.append(f"{q.name}: {key} {column}={cell['value']} unflagged")
            elif verdict == "sound" and flag:
                tally.flagged_sound += 1
                tally.examples.append(f"{q.name}: {key} {column}={cell['value']} flagged")
    return tally


def _cell(result, r: int, c: int, value, j: Judge) -> dict:
    info = (result.accuracy.get("columns") or [])[c] or {}
    pair = (info.get("intervals") or [None] * (r + 1))[r]
    band = (info.get("percentiles") or [None] * (r + 1))[r]
    flags = result.noise_dominates(result.columns[c])
    return {"value": value, "interval": pair, "band": band, "flag": flags[r],
            "radius": info.get("rank_radius")}  # fmt: skip


def _group(data: pd.DataFrame, q: Query, key: tuple) -> np.ndarray | None:
    """A quantile's group: the argument's values in the rows of group ``key``."""
    column = next((j.column for j in q.judges.values() if j.kind == "quantile"), "")
    if not column:
        return None
    rows = data
    where = q.sql.upper().split(" WHERE ")
    if len(where) > 1:
        raise ValueError("quantile queries here have no WHERE")
    key_columns = q.sql.split("SELECT ", 1)[1].split(",")[: q.keys]
    for name, value in zip((k.strip() for k in key_columns), key, strict=True):
        rows = rows[rows[name] == value]
    return np.sort(rows[column].to_numpy())


def _percentile(group: np.ndarray, value: float, slack: float = 0.0) -> tuple[float, float]:
    """The share of the group's values strictly below ``value``, and at or below it;
    values within ``slack`` of it count as at it (the gate snaps values to its grid of
    candidates, so a released value stands for those within half a step)."""
    n = len(group)
    below = np.searchsorted(group, value - slack, side="left")
    at = np.searchsorted(group, value + slack, side="right")
    return below / n, at / n


def _half_step(j: Judge) -> float:
    """Half a step of the gate's grid of candidates over ``j``'s declared bounds."""
    return (j.hi - j.lo) / 2000 + 1e-9


def _distance(level: float, band: tuple[float, float]) -> float:
    return max(band[0] - level, level - band[1], 0.0)


def _truth_verdict(j: Judge, true, cells: list[dict], group) -> str:
    """Whether noise dominates the true value by the rule, measured from the runs:
    ``dominated``, ``sound`` or ``grey`` (docstring: the margins)."""
    values = np.array([c["value"] for c in cells if c["value"] is not None], dtype=float)
    if j.kind == "quantile":
        if group is None or len(group) == 0:
            return "dominated"
        # As the noise did: how far the released values' true percentiles strayed; and
        # as the mechanism's guarantee allows at the true group size (its 95% rank
        # radius over the true count): sound only if both are small.
        spread = np.quantile(
            [_distance(j.level, _percentile(group, v, _half_step(j))) for v in values], 0.95
        )
        allowed = max(float(c["radius"] or 0.0) for c in cells) / len(group)
        widths = [min(1.0, j.level + x) - max(0.0, j.level - x) for x in (spread, allowed)]
        return _by(max(widths) / 0.5)
    if true is None:  # an empty group's average: any value is noise
        return "dominated"
    if j.kind == "range":
        width = np.quantile(values, 0.975) - np.quantile(values, 0.025)
        return _by(width / (0.5 * (j.hi - j.lo)))
    error = np.quantile(np.abs(values - float(true)), 0.95)
    if true == 0:
        return "dominated" if error > 0 else "sound"
    return _by(error / abs(float(true)))


def _by(ratio: float) -> str:
    """``ratio``: the noise's size over the rule's threshold."""
    if ratio >= MARGIN_DOMINATED:
        return "dominated"
    if ratio <= 1 / MARGIN_SOUND:
        return "sound"
    return "grey"


def _holds(j: Judge, true, cell: dict, group) -> bool:
    """Whether the cell's interval (a quantile's percentile band) holds the truth: a
    cell whose does not is the interval's miss, not the flag's."""
    if j.kind == "quantile":
        band = cell["band"]
        if group is None or len(group) == 0 or band is None:
            return True  # nothing to hold: the verdict alone is judged
        where = _percentile(group, cell["value"], _half_step(j))
        return band[0] - 1e-9 <= where[1] and where[0] <= band[1] + 1e-9
    pair = cell["interval"]
    if pair is None:
        return True
    if true is None:
        # An empty group's average holds nothing; only an interval over all of its
        # range claims nothing.
        return j.kind == "range" and pair[0] <= j.lo + 1e-9 and pair[1] >= j.hi - 1e-9
    return pair[0] - 1e-9 <= float(true) <= pair[1] + 1e-9


def _holds_in_units(j: Judge, cell: dict, group) -> bool:
    """Whether a quantile's interval in the column's units holds the group's true
    quantile (the least value with at least ``level·n`` values at or below it), to
    half a step of the gate's grid of candidates over the declared bounds."""
    if j.kind != "quantile" or group is None or len(group) == 0 or cell["interval"] is None:
        return True
    true = group[max(math.ceil(j.level * len(group)) - 1, 0)]
    slack = _half_step(j)
    low, high = cell["interval"]
    return low - slack <= true <= high + slack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="runs of each query")
    parser.add_argument("--epsilon", type=float, default=EPSILON)
    parser.add_argument("--json", type=Path, help="also write the tallies here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    tallies = run(args.runs, args.epsilon)
    total = Tally()
    print(f"{args.runs} runs of each query at ε = {args.epsilon}\n")
    header = ("query", "cells", "flagged", "may dominate", "interval missed",
              "quantile's interval in units missed", "grey", "unflagged but dominated",
              "flagged but sound")  # fmt: skip
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, t in tallies.items():
        total.add(t)
        print(f"| {name} | {t.cells} | {t.flagged} | {t.unjudged} | {t.missed} | "
              f"{t.units_missed} | {t.grey} | {t.unflagged_dominated} | "
              f"{t.flagged_sound} |")  # fmt: skip
    t = total
    print(f"| **all** | {t.cells} | {t.flagged} | {t.unjudged} | {t.missed} | "
          f"{t.units_missed} | {t.grey} | **{t.unflagged_dominated}** | "
          f"**{t.flagged_sound}** |")  # fmt: skip
    for example in t.examples:
        print("  e.g.", example)
    print(f"\n{time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({n: vars(t) for n, t in tallies.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
