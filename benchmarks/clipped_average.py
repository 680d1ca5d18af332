"""Averages with ``--clip`` (``sql/clip.py``): how often each cell's 95% interval
holds the quantity it reports, and how far the cell is from the plain average.

Two data sets, each answered ``--reps`` times afresh through a real engine at each
``--epsilons`` with ``--clip SHARE``:

- ``modechoice``: statsmodels' travel-mode data (210 travellers, one row per
  traveller and mode, 840 rows; the privacy unit is the traveller), ``AVG(invt)``
  (in-vehicle time, declared ``[0, 1500]``) by mode. Air's times (mean 133.7) lie
  at the bottom of all rows together: a clip chosen from all groups' rows moves
  most of them when its lower bound comes out high.
- ``lognormal``: incomes drawn lognormal (median 20,000, σ = 0.6) within a
  declared ``[0, 200,000]``, one row per person, ``AVG(income)`` over all rows and
  by group: a skewed column.

Per cell it prints the plain average (``truth``), the average of the values moved
into the bounds the reply says were used (``clipped``: what a clipped cell
reports; the plain average where the gate kept the declared bounds), how often the
interval held each, the share of runs that kept the declared bounds and the
root mean squared error against the truth. With ``--compare`` it also answers each
query without ``--clip`` at the same ε.

    python benchmarks/clipped_average.py [--data modechoice] [--epsilons 0.3,1]
        [--reps 200] [--share 0.25] [--compare] [--before]

Not a test (``tests/unit/test_clip_coverage.py`` is): prints the figures and the
machine's load. With 200 runs a coverage of 95% is known to ±1.5% (one standard
error).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from dpmagic.gate import clip_releases
from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy

POLICY = """
[gate]
state_dir = "state"
response_quantum_ms = 0

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
user_budget = {{ epsilon = 1e9 }}
notebook_budget = {{ epsilon = 1e9 }}
max_partitions = {partitions}

[datasets.d.tables.t]
max_rows_per_unit = {partitions}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
g = {{ type = "str", public_values = [{groups}] }}
x = {{ type = "float", lower = 0, upper = {upper} }}
"""

MODES = {1: "air", 2: "train", 3: "bus", 4: "car"}


def modechoice() -> tuple[list[tuple[int, str, float]], float, int]:
    """Rows ``(traveller, mode, in-vehicle time)``, the declared upper bound, and the
    rows (groups) per traveller."""
    from statsmodels.datasets import modechoice as source

    data = source.load_pandas().data
    rows = [
        (int(r.individual), MODES[int(r.mode)], float(r.invt)) for r in data.itertuples(index=False)
    ]
    return rows, 1500.0, 4


def lognormal(
    people: int = 4000, groups: int = 4
) -> tuple[list[tuple[int, str, float]], float, int]:
    rng = random.Random(11)
    rows = [
        (i, f"g{i % groups}", round(min(200000.0, rng.lognormvariate(math.log(20000), 0.6)), 2))
        for i in range(people)
    ]
    return rows, 200000.0, 1


DATA = {"modechoice": modechoice, "lognormal": lognormal}


def used_bounds(reply: dict) -> tuple[float, float]:
    """The bounds the answer's values were moved into, as the reply states them."""
    ((lo, hi),) = [c["bounds"] for c in reply["bounding"]["clamps"]]
    return float(lo), float(hi)


def measure(engine: Engine, rows: list, sql: str, grouped: bool, epsilon: float,
            reps: int, share: float | None) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per cell: truth, coverage of the truth and of the reported quantity, RMSE,
    the share of runs whose reply kept the declared bounds, the median bounds."""
    values: dict[str, list[float]] = defaultdict(list)
    for _, g, x in rows:
        values[g if grouped else "all"].append(x)
    held = defaultdict(lambda: [0, 0])  # [truth, reported]
    errors: dict[str, list[float]] = defaultdict(list)
    kept, lows, highs = 0, [], []
    for i in range(reps):
        ask = {"sql": sql, "epsilon": epsilon, "fresh": True, "notebook": f"n{i}"}
        if share is not None:
            ask["clip"] = share
        reply = engine.query("bench", ask)
        lo, hi = used_bounds(reply) if share is not None else (-math.inf, math.inf)
        if share is not None:
            lows.append(lo)
            highs.append(hi)
            facts = reply["clip"]["chosen"][0]
            kept += facts.get("source") == "declared"
        intervals = reply["accuracy"]["columns"][-1]["intervals"]
        for row, (a, b) in zip(reply["rows"], intervals, strict=True):
            cell = row[0] if grouped else "all"
            truth = statistics.fmean(values[cell])
            reported = statistics.fmean(min(max(x, lo), hi) for x in values[cell])
            held[cell][0] += a <= truth <= b
            held[cell][1] += a <= reported <= b
            errors[cell].append(row[-1] - truth)
    out = {}
    for cell in sorted(held):
        out[cell] = {
            "truth": statistics.fmean(values[cell]),
            "truth_coverage": held[cell][0] / reps,
            "reported_coverage": held[cell][1] / reps,
            "rmse": math.sqrt(statistics.fmean(e * e for e in errors[cell])),
        }
    if share is not None:
        out["_"] = {"declared": kept / reps, "lower": statistics.median(lows),
                    "upper": statistics.median(highs)}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=sorted(DATA), default="modechoice")
    parser.add_argument("--epsilons", default="0.3,1")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--share", type=float, default=0.25)
    parser.add_argument("--compare", action="store_true", help="also without --clip")
    parser.add_argument(
        "--before",
        action="store_true",
        help="the engine's own two releases, bounds always used, as in issue 39 (the bounds' "
        "release now also counts, so each bound has a third of its ε where it had half: "
        "docs/accuracy.md's 'before' is from the code before the rule)",
    )
    args = parser.parse_args()
    if not args.before:
        # The engine's ``_clipped`` as ``clip_releases.answer`` (the diff its docstring
        # names); a no-op once the engine delegates to it.
        Engine._clipped = clip_releases.answer  # type: ignore[method-assign]
    rows, upper, partitions = DATA[args.data]()
    groups = sorted({g for _, g, _ in rows})
    queries = [("by group", "SELECT g, AVG(x) AS a FROM t GROUP BY g", True)]
    if args.data == "lognormal":
        queries.insert(0, ("all rows", "SELECT AVG(x) AS a FROM t", False))
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        (base / "t.csv").write_text("pid,g,x\n" + "".join(f"{p},{g},{x}\n" for p, g, x in rows))
        listed = ", ".join(f'"{g}"' for g in groups)
        policy = POLICY.format(groups=listed, upper=upper, partitions=partitions)
        (base / "p.toml").write_text(policy)
        engine = Engine(load_policy(base / "p.toml"))
        try:
            for eps in (float(e) for e in args.epsilons.split(",")):
                for label, sql, grouped in queries:
                    kinds = [("clip", args.share)] + ([("plain", None)] if args.compare else [])
                    for kind, share in kinds:
                        r = measure(engine, rows, sql, grouped, eps, args.reps, share)
                        head = f"{args.data} {label}, ε {eps:g}, {kind}"
                        if "_" in r:
                            s = r.pop("_")
                            head += (f" (share {share:g}): declared bounds kept in "
                                     f"{s['declared']:.1%} of runs, median bounds "
                                     f"[{s['lower']:,.1f}, {s['upper']:,.1f}]")  # fmt: skip
                        print(head)
                        for cell, v in r.items():
                            print(f"  {cell:>6}: truth {v['truth']:>10,.1f}  "
                                  f"holds truth {v['truth_coverage']:6.1%}  "
                                  f"holds reported {v['reported_coverage']:6.1%}  "
                                  f"RMSE {v['rmse']:>9,.1f}")  # fmt: skip
        finally:
            engine.close()
    print(f"{args.reps} runs each; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
