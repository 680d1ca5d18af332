"""``--clip`` says what a clipped cell holds (issue 39, item 3; ``sql/clip.py``'s rule,
``clip_releases.py``'s releases and reply).

On two generated data sets like the issue's: travel times by mode, one row per
traveller and mode, air's times far below the others' (a grouped column whose
groups lie apart), and lognormal incomes in groups (a skewed column):

- at too little ε the rule keeps the declared bounds and the reply says so, with the
  figures it read; with enough, the bounds from the data are used, a noisy count of
  the values moved comes per group, the releases cost the ε asked for in all and
  replay alike;
- (``search``) over 250 fresh runs at ε 0.3 and 1, each 4 cells, every condition's
  95% intervals hold the quantity the reply says they hold (the plain average where
  the declared bounds were kept, the average of the values moved into the bounds
  used where the clip was used) in 93–97% of the 1,000 cells. The binomial standard
  error of a 95% coverage over 1,000 cells is 0.69%: a calibrated interval leaves
  the band in one condition with probability about 0.4% (2.9 standard errors on each
  side), in any of the four about 1.5%. The broken version (the bounds always used,
  as the engine did in the issue) is caught at the issue's size (210 travellers):
  air's interval then holds its average in under 80% of runs at ε 0.3; the engine's
  own flow does not say what its intervals hold.

``Engine._clipped`` is ``clip_releases.answer`` here (``use_releases``): the
engine's flow with the rule is that function, a diff the engine's owner applies.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict

import pytest

from dpmagic.gate import clip_releases
from dpmagic.gate.engine import Engine
from dpmagic.gate.sql.clip import clipped
from tests.gate_helpers import running_engine

MODES = ("air", "train", "bus", "car")
# Medians and σ of each mode's log time (minutes), as in statsmodels' modechoice data.
TIMES = {"air": (120, 0.35), "train": (500, 0.45), "bus": (580, 0.45), "car": (480, 0.55)}

TRAVEL = """
[gate]
state_dir = "state"
response_quantum_ms = 0

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
user_budget = { epsilon = 1e9 }
notebook_budget = { epsilon = 1e9 }
max_partitions = 4

[datasets.d.tables.t]
max_rows_per_unit = 4

[datasets.d.tables.t.columns]
pid = { type = "int" }
g = { type = "str", public_values = ["air", "train", "bus", "car"] }
x = { type = "float", lower = 0, upper = 1500 }
"""
INCOME = """
[gate]
state_dir = "state"
response_quantum_ms = 0

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
user_budget = { epsilon = 1e9 }
notebook_budget = { epsilon = 1e9 }

[datasets.d.tables.t]
max_rows_per_unit = 1

[datasets.d.tables.t.columns]
pid = { type = "int" }
g = { type = "str", public_values = ["g0", "g1", "g2", "g3"] }
x = { type = "float", lower = 0, upper = 200000 }
"""
SQL = "SELECT g, AVG(x) AS a FROM t GROUP BY g"


def travel_rows(travellers: int) -> list[tuple[int, str, float]]:
    rng = random.Random(39)
    return [
        (p, mode, round(min(1500.0, rng.lognormvariate(math.log(m), s)), 1))
        for p in range(travellers)
        for mode, (m, s) in TIMES.items()
    ]


def income_rows(people: int) -> list[tuple[int, str, float]]:
    rng = random.Random(11)
    return [
        (p, f"g{p % 4}", round(min(200000.0, rng.lognormvariate(math.log(20000), 0.6)), 2))
        for p in range(people)
    ]


@pytest.fixture(autouse=True)
def use_releases(monkeypatch):
    monkeypatch.setattr(Engine, "_clipped", clip_releases.answer)


@pytest.fixture(scope="module")
def travel(tmp_path_factory):
    rows = travel_rows(3000)
    with running_engine(tmp_path_factory.mktemp("tr"), TRAVEL, {"t": ("pid,g,x", rows)}) as e:
        yield e, rows


@pytest.fixture(scope="module")
def income(tmp_path_factory):
    rows = income_rows(4000)
    with running_engine(tmp_path_factory.mktemp("in"), INCOME, {"t": ("pid,g,x", rows)}) as e:
        yield e, rows


def _ask(epsilon: float, i: int = 0) -> dict:
    return {"sql": SQL, "epsilon": epsilon, "clip": 0.25, "fresh": True, "notebook": f"n{i}"}


def test_too_little_epsilon_keeps_the_declared_bounds_and_says_why(travel) -> None:
    """The issue's case: bounds chosen with ε 0.075 over 3,000 values are within
    about 780 ranks of their quantiles, more than a tenth of the values."""
    engine, _ = travel
    reply = engine.query("ann", _ask(0.3))
    (fact,) = reply["clip"]["chosen"]
    assert fact["source"] == "declared" and fact["bounds"] == [0.0, 1500.0]
    assert fact["declared"] == [0.0, 1500.0] and fact["selected"] != fact["bounds"]
    assert fact["rank_error"] > 0.1 * fact["values_low"]
    assert "declared bounds were kept" in fact["reason"] and "moved" not in fact
    assert "nothing moved" in fact["holds"]
    assert reply["clip"]["moved_epsilon"] == 0.0 and "rule" in reply["clip"]
    assert reply["cost"]["epsilon"] == pytest.approx(0.3)
    assert reply["bounding"]["clamps"][0]["bounds"] == [0.0, 1500.0]


def test_enough_epsilon_clips_counts_the_values_moved_and_replays(income) -> None:
    engine, rows = income
    ask = {**_ask(1.0), "fresh": False, "notebook": "replay"}
    before = engine.ledger.spent("bob", "d", "replay").epsilon
    reply = engine.query("bob", ask)
    (fact,) = reply["clip"]["chosen"]
    assert fact["source"] == "data" and fact["bounds"] == fact["selected"]
    assert fact["rank_error"] <= 0.1 * fact["values_low"]
    lo, hi = fact["bounds"]
    assert reply["bounding"]["clamps"][0]["bounds"] == [lo, hi]
    assert "values moved into" in fact["holds"]
    # all releases together cost the ε asked for, the count of values moved its share
    assert reply["cost"]["epsilon"] == pytest.approx(1.0)
    assert engine.ledger.spent("bob", "d", "replay").epsilon - before == pytest.approx(1.0)
    assert reply["clip"]["moved_epsilon"] == pytest.approx(0.75 * clip_releases.MOVED_SHARE)
    # per group, the noisy count of values outside the clip (Laplace scale about 27 here)
    exact = defaultdict(int)
    for _, g, x in rows:
        exact[g] += x < lo or x > hi
    moved = {m["group"][0]: m for m in fact["moved"]}
    assert sorted(moved) == ["g0", "g1", "g2", "g3"]
    for g, m in moved.items():
        assert abs(m["count"] - exact[g]) < 300 and m["interval"][0] <= m["count"]
    again = engine.query("bob", ask)
    assert again["replayed"] and again["clip"]["replayed"]
    assert again["clip"]["chosen"] == reply["clip"]["chosen"] and again["rows"] == reply["rows"]
    assert engine.ledger.spent("bob", "d", "replay").epsilon - before == pytest.approx(1.0)


def test_a_dry_run_states_the_rule_and_chooses_nothing(income) -> None:
    engine, _ = income
    reply = engine.query("cy", {**_ask(1.0), "dry_run": True})
    assert reply["clip"]["chosen"] == [] and "declared bounds are kept" in reply["clip"]["rule"]


def _coverage(engine: Engine, rows: list, epsilon: float, runs: int) -> tuple[dict, dict, list]:
    """Per group, how often the interval held the plain average and the quantity the
    reply says it holds; and the replies' ``chosen`` facts."""
    values: dict[str, list[float]] = defaultdict(list)
    for _, g, x in rows:
        values[g].append(x)
    plain = {g: statistics.fmean(v) for g, v in values.items()}
    held_plain: dict[str, int] = defaultdict(int)
    held_reported: dict[str, int] = defaultdict(int)
    said = []
    for i in range(runs):
        reply = engine.query("mc", _ask(epsilon, i))
        (fact,) = reply["clip"]["chosen"]
        said.append(fact)
        lo, hi = reply["bounding"]["clamps"][0]["bounds"]
        intervals = reply["accuracy"]["columns"][1]["intervals"]
        for (g, _), (a, b) in zip(reply["rows"], intervals, strict=True):
            reported = statistics.fmean(min(max(x, lo), hi) for x in values[g])
            held_plain[g] += a <= plain[g] <= b
            held_reported[g] += a <= reported <= b
    return held_plain, held_reported, said


RUNS = 250


@pytest.mark.search
@pytest.mark.parametrize("data", ["travel", "income"])
@pytest.mark.parametrize("epsilon", [0.3, 1.0])
def test_intervals_hold_the_reported_quantity(data, epsilon, request) -> None:
    engine, rows = request.getfixturevalue(data)
    _, reported, said = _coverage(engine, rows, epsilon, RUNS)
    coverage = sum(reported.values()) / (RUNS * len(reported))
    print(f"{data} ε {epsilon}: {coverage:.1%} of {RUNS * len(reported)} cells; "
          f"declared kept in {sum(f['source'] == 'declared' for f in said)} of {RUNS}")  # fmt: skip
    assert 0.93 <= coverage <= 0.97
    assert all("holds" in f and "reason" in f for f in said)


@pytest.fixture(scope="module")
def travel_small(tmp_path_factory):
    """The issue's size: 210 travellers, 840 rows."""
    rows = travel_rows(210)
    with running_engine(tmp_path_factory.mktemp("ts"), TRAVEL, {"t": ("pid,g,x", rows)}) as e:
        yield e, rows


@pytest.mark.search
def test_the_broken_version_is_caught(travel_small, monkeypatch) -> None:
    """The issue's case, 100 runs at ε 0.3 over 210 travellers. Without the rule (every
    bound used as it comes, as the engine did): air's interval holds its average in
    under 80% of runs (about 35-50% measured; at a true 50% reaching 80 of 100 has
    probability below 1e-9). With it: the declared bounds are kept in every run and
    air's interval holds its average in at least 90% (about 97-100% measured: these
    small groups' intervals fall back to interval arithmetic, which over-covers)."""
    engine, rows = travel_small
    with monkeypatch.context() as patch:
        # ``clipped`` as the engine called it: the row alone, so no rule applies
        patch.setattr(clip_releases, "clipped", lambda checked, row, *_: clipped(checked, row))
        plain, _, said = _coverage(engine, rows, 0.3, 100)
    assert not any("source" in f or "holds" in f for f in said)  # nor does it say so
    print(f"without the rule air held in {plain['air']} of 100, others {dict(plain)}")
    assert plain["air"] / 100 < 0.8
    plain, _, said = _coverage(engine, rows, 0.3, 100)
    print(f"with it air held in {plain['air']} of 100, others {dict(plain)}")
    assert all(f["source"] == "declared" for f in said)
    assert plain["air"] / 100 >= 0.9


def test_the_engine_without_the_rule_says_nothing_of_it(travel, monkeypatch) -> None:
    """``clip.clipped`` called as the engine calls it today (the row alone, no plan):
    the bounds as released, and no fact of which or why (``facts`` has no source)."""
    engine, _ = travel
    monkeypatch.setattr(Engine, "_clipped", ENGINE_OWN)
    (fact,) = engine.query("dee", _ask(0.3))["clip"]["chosen"]
    if "source" in fact:  # the engine delegates to ``clip_releases.answer`` already
        pytest.skip("the engine runs clip_releases.answer")
    assert set(fact) == {"aggregate", "bounds"}


ENGINE_OWN = Engine._clipped


PRIVATE_KEYS = """
[gate]
state_dir = "state"
response_quantum_ms = 0

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
accountant = "approx"
user_budget = { epsilon = 1e9, delta = 1e-3 }
notebook_budget = { epsilon = 1e9, delta = 1e-3 }

[datasets.d.tables.t]
max_rows_per_unit = 1

[datasets.d.tables.t.columns]
pid = { type = "int" }
g = { type = "str" }
x = { type = "float", lower = 0, upper = 200000 }
"""


def test_groups_with_private_keys_get_one_count_of_values_moved(tmp_path) -> None:
    """Keys released by partition selection: the count of values moved is of all the
    query's rows, so that it selects no groups of its own; the bounds and the count
    spend no δ, so the releases together cost the (ε, δ) asked for."""
    rows = income_rows(4000)
    with running_engine(tmp_path, PRIVATE_KEYS, {"t": ("pid,g,x", rows)}) as engine:
        reply = engine.query("eve", {**_ask(20.0), "delta": 1e-6})
    (fact,) = reply["clip"]["chosen"]
    assert fact["source"] == "data" and len(reply["rows"]) == 4
    ((moved),) = fact["moved"]
    assert moved["group"] == [] and moved["count"] > 0
    assert reply["cost"] == {"epsilon": pytest.approx(20.0), "delta": pytest.approx(1e-6)}
