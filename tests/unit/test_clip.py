"""``--clip``: a sum's value bounds chosen privately (``sql/clip.py``).

The second release's sensitivity holds for every clip, whatever the data: brute
force over neighbouring datasets with values beyond the clip, seed by seed on real
DuckDB, for clips drawn at random; the version that narrows the interval without
clamping the SQL into it (trusting the stored values to lie within) is caught.
Through the engine: two releases, each in the ledger, charged ε in all, replayed
alike, the bounds chosen stated in the reply."""

from __future__ import annotations

import math
import random

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.failures import InvalidBody, Refused
from dpmagic.gate.sql import plan as plans
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.clip import (
    USEFUL_RANKS,
    ClipMoved,
    Clipped,
    bounds_checked,
    clip_bounded,
    clipped,
)
from dpmagic.gate.sql.kinds import Summand
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import dataset, exact_vectors, load_table, neighbours, running_engine

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": 0, "upper": 100},
    "y": {"type": "float", "lower": 0.0, "upper": 1000.0},
}
ORDER = ["pid", "g", "x", "y"]
QUERIES = [
    "SELECT SUM(x) FROM t",
    "SELECT g, AVG(y) FROM t GROUP BY g",
    "SELECT g, SUM(x), VAR_POP(y) FROM t GROUP BY g",
]


def _clipped_plan(sql: str, clips: dict[str, tuple[float, float]]):
    ds = dataset(COLUMNS, max_partitions=2, max_rows=2)
    checked = check(resolve(parse(sql), ds))
    stage = Clipped(tuple((f"__s0.{c}", lo, hi) for c, (lo, hi) in clips.items()))
    return plan(clip_bounded(bound(checked), stage), 1.0, 0.0, PureAccountant())


row = st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 100), st.floats(0, 1000))
units = st.lists(st.lists(row, min_size=0, max_size=4), min_size=1, max_size=4)


def _worst(p, per_unit, seed) -> list[tuple[float, float]]:
    """Per measurement, the largest L1 move over every neighbour, and its sensitivity."""
    con = duckdb.connect()
    rows = [(pid, *r) for pid, rs in enumerate(per_unit, start=1) for r in rs]
    load_table(con, "t", ORDER, rows)
    base = exact_vectors(p, con, seed)
    worst = {m.name: 0.0 for m in p.measurements}
    for other in neighbours(rows, len(per_unit), True, "add_remove", []):
        load_table(con, "t", ORDER, other)
        moved = exact_vectors(p, con, seed)
        for m in p.measurements:
            d = sum(abs(a - b) for a, b in zip(base[m.name], moved[m.name], strict=True))
            worst[m.name] = max(worst[m.name], d)
    return [(worst[m.name], m.noise.sensitivity) for m in p.measurements]


@pytest.mark.search
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(per_unit=units, query=st.sampled_from(QUERIES), x=st.integers(1, 60),
       y=st.floats(1, 500), seed=st.integers(0, 2**62))  # fmt: skip
def test_every_clip_keeps_its_sensitivity(per_unit, query, x, y, seed) -> None:
    p = _clipped_plan(query, {"x": (0, x), "y": (0.0, y)})
    for moved, sensitivity in _worst(p, per_unit, seed):
        assert moved <= sensitivity


def test_a_clip_the_sql_does_not_clamp_into_is_caught(monkeypatch) -> None:
    """The broken version: the interval narrowed, the SQL trusting the stored values
    (clamped at load into the declared, wider range) to lie within it."""
    monkeypatch.setattr(plans, "_summand", lambda part, resolved: Summand.STORED)
    p = _clipped_plan("SELECT SUM(x) FROM t", {"x": (0, 10)})
    ((moved, sensitivity),) = _worst(p, [[(0, 100, 0.0)] * 3, [(1, 5, 0.0)]], seed=1)
    assert sensitivity == 20 and moved > sensitivity


def test_the_bounds_release_asks_each_summed_argument_at_two_levels_and_counts_it() -> None:
    """The count is what the rule judges the bounds' rank error against."""
    ds = dataset(COLUMNS)
    checked = check(resolve(parse("SELECT g, AVG(y), SUM(x), COUNT(*) FROM t GROUP BY g"), ds))
    first = bounds_checked(checked)
    assert first.keys == ()
    assert [(a.func, a.level, a.arg.sql()) for a in first.aggregates] == [
        ("quantile", 0.02, "__s0.y"), ("quantile", 0.98, "__s0.y"), ("count", None, "__s0.y"),
        ("quantile", 0.02, "__s0.x"), ("quantile", 0.98, "__s0.x"), ("count", None, "__s0.x"),
    ]  # fmt: skip
    assert bounds_checked(check(resolve(parse("SELECT COUNT(*) FROM t"), ds))).aggregates == ()
    # nothing to choose: no unit, one row a person and group, or one row a person at all
    for nothing in (
        dataset(COLUMNS, unit=None),
        dataset(COLUMNS, max_rows=1),
        dataset(COLUMNS, table_options={"max_rows_per_unit": 1}),
    ):
        with pytest.raises(Refused, match="sums none, and its dataset has no privacy unit or"):
            bounds_checked(check(resolve(parse("SELECT COUNT(*) FROM t"), nothing)))


POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
user_budget = { epsilon = 1e6 }
notebook_budget = { epsilon = 1e6 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
g = { type = "int", public_values = [0, 1] }
income = { type = "float", lower = 0, upper = 200000 }
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    rng = random.Random(3)
    rows = [(i, i % 2, round(rng.lognormvariate(math.log(20000), 0.6), 2)) for i in range(4000)]
    with running_engine(tmp_path_factory.mktemp("c"), POLICY, {"t": ("pid,g,income", rows)}) as e:
        yield e


def test_a_clipped_query_releases_twice_and_replays_both(engine) -> None:
    ask = {"sql": "SELECT g, AVG(income) AS a FROM t GROUP BY g", "epsilon": 1.0,
           "clip": 0.25, "notebook": "clip"}  # fmt: skip
    before = engine.ledger.spent("ann", "d", "clip").epsilon
    reply = engine.query("ann", ask)
    assert engine.ledger.spent("ann", "d", "clip").epsilon - before == pytest.approx(1.0)
    assert reply["cost"]["epsilon"] == pytest.approx(1.0)
    ((lo, hi),) = [c["bounds"] for c in reply["clip"]["chosen"]]
    assert 0 <= lo < hi < 200000 and reply["clip"]["epsilon"] == pytest.approx(0.25)
    # the bounds are stated where the answer's bounds are
    assert f"{hi:g}"[:3] in reply["bounding"]["text"].replace(",", "")
    again = engine.query("ann", ask)
    assert again["replayed"] and again["clip"]["replayed"] and again["rows"] == reply["rows"]
    assert engine.ledger.spent("ann", "d", "clip").epsilon - before == pytest.approx(1.0)
    history = engine.history("ann", "d", "clip", 10)["entries"]
    assert any(e["sql"].startswith("-- --clip") for e in history)


def test_a_clipped_dry_run_states_what_both_releases_cost(engine) -> None:
    """The bounds' share is part of the cost a dry run states (it said 0.75 of an ε of
    1, the query's part alone), and nothing is charged."""
    ask = {"sql": "SELECT AVG(income) FROM t", "epsilon": 1.0, "clip": 0.25, "dry_run": True}
    reply = engine.query("dry", {**ask, "notebook": "dry"})
    assert reply["cost"]["epsilon"] == pytest.approx(1.0)
    assert engine.ledger.spent("dry", "d", "dry").epsilon == 0.0


def test_clip_takes_a_share_and_an_epsilon_only(engine) -> None:
    for bad in ({"clip": 1.0}, {"clip": 0.2, "accuracy": 10.0}):
        with pytest.raises(InvalidBody):
            engine.query("ann", {"sql": "SELECT AVG(income) FROM t", **bad})


def test_a_transcript_replays_clipped_and_bounded_answers_offline(engine, tmp_path) -> None:
    """The autograder's path: the answers exported from the ledger, asked again through
    ``TranscriptGate`` with the same arguments the magic passes."""
    import json

    from dpmagic.client.transcript import TranscriptGate
    from dpmagic.gate.service.signed_transcripts import export

    sql = "SELECT g, AVG(income) AS a FROM t GROUP BY g"
    nb = "graded"
    clipped_reply = engine.query("cy", {"sql": sql, "epsilon": 1.0, "clip": 0.25, "notebook": nb})
    bounded = engine.query("cy", {"sql": sql, "epsilon": 0.5, "max_partitions": 1, "notebook": nb})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(export(engine.ledger, engine.policy, "cy", nb)))
    offline = TranscriptGate(path)
    again = offline.query(sql, epsilon=1.0, clip=0.25, notebook=nb)
    assert again.reply["rows"] == clipped_reply["rows"]
    assert again.reply["clip"]["chosen"] == clipped_reply["clip"]["chosen"]
    assert offline.query(sql, epsilon=0.5, max_partitions=1).reply["rows"] == bounded["rows"]


def test_the_footer_says_the_clip_and_the_schema_what_bounds_cost(engine) -> None:
    from dpmagic.display.result import DPResult
    from dpmagic.display.schema import SchemaView

    reply = engine.query(
        "dee", {"sql": "SELECT AVG(income) AS a FROM t", "epsilon": 1.0, "clip": 0.25}
    )
    footer = DPResult(reply).footer()
    ((lo, hi),) = [c["bounds"] for c in reply["clip"]["chosen"]]
    assert lo < hi
    assert "values clipped: AVG(income) within [" in footer and "chosen with ε 0.25" in footer
    again = DPResult(engine.query("dee", {"sql": "SELECT AVG(income) AS a FROM t",
                                          "epsilon": 1.0, "clip": 0.25}))  # fmt: skip
    assert again.replayed and "values clipped" in again.footer()
    schema = SchemaView(engine.schema("d")).summary()
    error = engine.schema("d")["count_error"]
    assert f"±{error['ungrouped']}, ±{error['grouped']} grouped" in schema


def _first_plan(sql: str, epsilon: float):
    """The bounds' release of ``sql`` as the engine plans it (``pipeline.analyse``)."""
    ds = dataset(COLUMNS)
    checked = check(resolve(parse(sql), ds))
    first = plan(bound(bounds_checked(checked)), epsilon, 0.0, PureAccountant(),
                 quantile_intervals=False)  # fmt: skip
    return checked, first


def test_the_rule_uses_the_bounds_only_within_a_tenth_of_the_values() -> None:
    """At the threshold, from the plan's own rank radius: a count whose 95% interval
    reaches down to ten radii uses the bounds from the data; one value fewer keeps
    the declared ones, and says which and why."""
    checked, first = _first_plan("SELECT g, AVG(y) FROM t GROUP BY g", 0.5)
    radius = max(s.noise.rank_radius(0.05) for s in first.selections)
    # two bounds and a count share the ε; a unit moves ``distance`` values
    distance = first.selections[0].noise.distance
    expected = 2 * 0.98 * distance / (0.5 / 3) * math.log(1001 / 0.05)
    assert radius == pytest.approx(expected, rel=1e-3)
    need = radius / USEFUL_RANKS * (1 + 1e-12)  # at the threshold, past rounding
    used = clipped(checked, [5.0, 900.0, need + 50], first, [(need, need + 100)])
    (fact,) = used.facts
    assert fact.source == "data" and used.clips == (("__s0.y", 5.0, 900.0),)
    assert fact.rank_error == radius and fact.values_low == need and used.moves
    kept = clipped(checked, [5.0, 900.0, need + 50], first, [(need - 1, need + 99)])
    (fact,) = kept.facts
    assert fact.source == "declared" and kept.clips == (("__s0.y", 0.0, 1000.0),)
    assert fact.selected == (5.0, 900.0) and not kept.moves
    assert "declared bounds were kept" in fact.reason
    # a count whose interval reaches below zero: nothing to judge the bounds by
    (fact,) = clipped(checked, [5.0, 900.0, 3.0], first, [(-40.0, 46.0)]).facts
    assert fact.source == "declared"
    # an integer argument's bounds used as the query applies them, in whole numbers
    checked, first = _first_plan("SELECT SUM(x) FROM t", 1e6)
    (fact,) = clipped(checked, [2.5, 70.2, 1e6], first, [(1e6, 1e6)]).facts
    assert fact.source == "data" and fact.bounds == (2.0, 71.0)


def _moved_plan(sql: str, clips: dict[str, tuple[float, float]]):
    ds = dataset(COLUMNS, max_partitions=2, max_rows=2)
    checked = check(resolve(parse(sql), ds))
    stage = Clipped(tuple((f"__s0.{c}", lo, hi) for c, (lo, hi) in clips.items()))
    return plan(clip_bounded(bound(checked), ClipMoved(stage)), 1.0, 0.0, PureAccountant())


def test_the_values_moved_are_counted_per_group_outside_the_clip() -> None:
    """The third release's exact counts, before noise: per group, the rows whose value
    lies outside the clip (an integer argument's clip in whole numbers)."""
    p = _moved_plan("SELECT g, SUM(x), AVG(y) FROM t GROUP BY g", {"x": (10.4, 50), "y": (1, 9)})
    assert [m.noise.sensitivity for m in p.measurements] == [4, 4]
    rows = [(1, 0, 5, 0.5), (1, 0, 10, 10.0), (2, 1, 60, 5.0), (2, 2, 11, 9.5), (3, 2, 50, 1.0)]
    con = duckdb.connect()
    load_table(con, "t", ORDER, rows)
    exact = exact_vectors(p, con, seed=1)
    x, y = (exact[m.name] for m in p.measurements)
    assert list(x) == [1, 1, 0] and list(y) == [2, 0, 1]  # x: 5 below 10, 60 above 50


@pytest.mark.search
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(per_unit=units, query=st.sampled_from(QUERIES), x=st.integers(1, 60),
       y=st.floats(1, 500), seed=st.integers(0, 2**62))  # fmt: skip
def test_the_count_of_values_moved_keeps_its_sensitivity(per_unit, query, x, y, seed) -> None:
    p = _moved_plan(query, {"x": (x / 2, x), "y": (y / 2, y)})
    for moved, sensitivity in _worst(p, per_unit, seed):
        assert moved <= sensitivity


def test_the_bounds_of_one_argument_snap_its_values_once(monkeypatch) -> None:
    """Both bounds of a summed argument read one column of candidate indices (each value
    snapped once, one histogram counted), and each gets what it got with a column of
    its own."""
    from dpmagic.gate.sql import rewrite as rewrites

    checked = check(resolve(parse("SELECT g, SUM(x), AVG(y) FROM t GROUP BY g"), dataset(COLUMNS)))
    first = plan(bound(bounds_checked(checked)), 1.0, 0.0, PureAccountant(),
                 quantile_intervals=False)  # fmt: skip
    assert rewrites.rewrite(first, seed=1).sql.count('AS "__v_q') == 2  # x's and y's
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, 0, 5, 0.5), (1, 1, 70, 900.0), (2, 2, 30, 10.0)])
    shared = exact_vectors(first, con, seed=1)
    own = {s.name: "__v_" + s.name for s in first.selections}
    monkeypatch.setattr(rewrites, "_value_columns", lambda p: own)
    assert rewrites.rewrite(first, seed=1).sql.count('AS "__v_q') == 4
    assert exact_vectors(first, con, seed=1) == shared
