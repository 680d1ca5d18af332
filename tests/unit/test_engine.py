"""The gate's request path on a real ledger and real DuckDB: charges, dry runs,
replay, refusals that cost nothing, failures that stay charged."""

from __future__ import annotations

import os
import textwrap
import threading

import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import BadRequest, Failed, OverBudget, Refused
from tests.gate_helpers import running_engine, slow_runs
from tests.small_gate import POLICY, people, write_policy


@pytest.fixture
def engine(tmp_path):
    text = textwrap.dedent(POLICY.format(timeout=30.0))
    with running_engine(tmp_path, text, {"t": ("pid,age,sex", people(300))}) as e:
        yield e


def spent(engine: Engine, notebook: str = "nb") -> float:
    return engine.budget("alice", None, notebook)["notebook"]["spent"]["epsilon"]


def test_a_query_is_charged_and_answered(engine):
    reply = engine.query(
        "alice", {"sql": "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex", "notebook": "nb"}
    )
    assert reply["columns"] == ["sex", "n"]
    assert [r[0] for r in reply["rows"]] == [0, 1]
    assert reply["cost"] == {"epsilon": 0.5, "delta": 0.0}
    assert reply["budget"]["notebook"]["remaining"]["epsilon"] == pytest.approx(1.5)
    assert reply["budget"]["user"]["remaining"]["epsilon"] == pytest.approx(2.5)
    n = reply["accuracy"]["columns"][1]
    assert n["mechanism"] == "discrete_laplace" and n["scale"] > 0
    assert len(n["intervals"]) == 2


def test_dry_run_shows_the_plan_and_charges_nothing(engine):
    reply = engine.query(
        "alice",
        {"sql": "SELECT AVG(age) FROM t", "epsilon": 1.0, "dry_run": True, "notebook": "nb"},
    )
    assert reply["rows"] == [] and reply["dry_run"] is True
    assert reply["cost"]["epsilon"] == 1.0
    steps = [p for p in reply["plan"] if p["kind"] != "output"]
    assert {p["aggregate"] for p in steps} == {"SUM(age) centred on 50", "COUNT(age)"}
    # and per output column its expected error and where noise would dominate it
    (output,) = [p for p in reply["plan"] if p["kind"] == "output"]
    assert output["aggregate"] == "AVG(age)" and output["rule"] == "range"
    assert output["dominated_below"] > 1 and len(output["half_width_at"]) == 2
    assert spent(engine) == 0.0


def test_noise_dominating_at_every_size_is_reported_not_a_failure(engine):
    """A sum of values as small as 4.9e-324: its half-width over them overflows to an
    infinite group size, reported as ``EVERY_SIZE`` (it failed the query, charged)."""
    from dpmagic.gate.sql.summary import EVERY_SIZE

    for sql in ("SELECT SUM(age * 0 + 4.9e-324) AS s FROM t", "SELECT COUNT(*) AS n FROM t"):
        reply = engine.query("alice", {"sql": sql, "dry_run": True, "notebook": "nb"})
        (output,) = [p for p in reply["plan"] if p["kind"] == "output"]
        assert (output["dominated_below"] == EVERY_SIZE) == ("e-324" in sql)
    reply = engine.query("alice", {"sql": "SELECT SUM(age * 0 + 4.9e-324) AS s FROM t"})
    assert len(reply["rows"]) == 1


def test_replay_returns_the_same_answer_for_free_even_after_a_restart(tmp_path):
    policy = write_policy(tmp_path)
    body = {"sql": "SELECT sex, AVG(age) FROM t GROUP BY sex", "notebook": "nb"}
    first_engine = Engine(policy)
    first = first_engine.query("alice", body)
    again = first_engine.query(
        "alice", {**body, "sql": "select sex, avg(age)  from t group by sex"}
    )
    first_engine.close()
    assert again["replayed"] is True and again["rows"] == first["rows"]
    assert again["cost"]["epsilon"] == 0.0

    restarted = Engine(policy)
    try:
        replay = restarted.query("alice", body)
        assert replay["replayed"] is True and replay["rows"] == first["rows"]
        assert spent(restarted) == pytest.approx(0.5)
        # Another user gets no replay of alice's answer; a fresh query spends anew.
        assert restarted.query("bob", body)["replayed"] is False
        fresh = restarted.query("alice", {**body, "fresh": True})
        assert fresh["replayed"] is False
        assert spent(restarted) == pytest.approx(1.0)
        # A different epsilon is a different release.
        assert restarted.query("alice", {**body, "epsilon": 0.25})["replayed"] is False
    finally:
        restarted.close()


def test_over_budget_is_refused_with_the_numbers_and_charges_nothing(engine):
    engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "epsilon": 1.5, "notebook": "nb"})
    with pytest.raises(OverBudget) as info:
        engine.query("alice", {"sql": "SELECT SUM(age) FROM t", "epsilon": 1.0, "notebook": "nb"})
    assert "1" in info.value.message and "0.5" in info.value.message
    assert spent(engine) == pytest.approx(1.5)
    # A new notebook draws on the same user cap (3.0): it cannot mint budget.
    engine.query("alice", {"sql": "SELECT SUM(age) FROM t", "epsilon": 1.5, "notebook": "other"})
    with pytest.raises(OverBudget):
        engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "epsilon": 0.1, "notebook": "x"})


def test_refusals_and_bad_requests_cost_nothing(engine):
    with pytest.raises(Refused):
        engine.query("alice", {"sql": "SELECT age FROM t", "notebook": "nb"})
    with pytest.raises(BadRequest):
        engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "epsilon": -1, "notebook": "nb"})
    with pytest.raises(BadRequest):
        engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "delta": 1e-6, "notebook": "nb"})
    with pytest.raises(BadRequest):
        engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "dataset": "nope"})
    assert spent(engine) == 0.0


def test_a_failure_after_the_debit_is_generic_and_stays_charged(tmp_path, monkeypatch):
    # A run of a second (slow_runs), a thousand times the millisecond it is given.
    slow_runs(monkeypatch, 1.0)
    engine = Engine(write_policy(tmp_path, timeout=0.001))
    try:
        with pytest.raises(Failed) as info:
            engine.query(
                "alice", {"sql": "SELECT sex, SUM(age) FROM t GROUP BY sex", "notebook": "nb"}
            )
        assert "charged" in info.value.message
        assert spent(engine) == pytest.approx(0.5)
    finally:
        engine.close()


def test_cost_and_plan_do_not_depend_on_the_data(tmp_path):
    a = Engine(write_policy(tmp_path / "a", rows=300))
    b = Engine(write_policy(tmp_path / "b", rows=17))
    try:
        body = {"sql": "SELECT sex, AVG(age) FROM t GROUP BY sex", "dry_run": True}
        pa, pb = a.query("alice", body), b.query("alice", body)
        assert pa["cost"] == pb["cost"] and pa["plan"] == pb["plan"]
    finally:
        a.close()
        b.close()


def test_schema_shows_public_facts_only(engine):
    schema = engine.schema(None)
    assert schema["privacy_unit"] == "pid"
    assert schema["tables"]["t"]["columns"]["sex"]["public_values"] == [0, 1]
    assert schema["tables"]["t"]["columns"]["age"] == {"type": "int", "lower": 0, "upper": 100}


def test_a_bare_quantile_carries_its_interval_level_and_rank_radius(engine):
    reply = engine.query(
        "alice",
        {"sql": "SELECT sex, MEDIAN(age) AS m, MEDIAN(age) + 1 AS m1, "
                "MAX(age) - MIN(age) AS span FROM t GROUP BY sex", "notebook": "nb"},
    )  # fmt: skip
    m, m1, span = reply["accuracy"]["columns"][1:]
    assert m["mechanism"] == "exponential" and m["level"] == 0.5
    assert 0 < m["rank_radius"] < float("inf")
    assert all(lo <= hi for lo, hi in m["intervals"]) and m["count"] == "COUNT(age)"
    # a constant added moves the interval; ranks of a transformed value are not the value's
    assert m1["intervals"] == [[lo + 1, hi + 1] for lo, hi in m["intervals"]]
    assert "rank_radius" not in m1
    # two quantiles need each interval at 97.5%: the edges hold at 95% only
    assert span["intervals"] == [None, None] and span["noise_dominates"] == [None, None]
    # The dry run promises the same radius before anything is charged, and the
    # interval's ends' cost.
    steps = {s["kind"]: s for s in reply["plan"] if s["aggregate"].startswith("MEDIAN")}
    assert steps["quantile"]["level"] == 0.5
    assert steps["quantile"]["rank_radius"] == m["rank_radius"]
    ends = steps["quantile_interval"]
    assert ends["epsilon"] == pytest.approx(steps["quantile"]["epsilon"], rel=1e-9)  # 2 × ½


def test_a_reply_waits_for_its_debit_to_be_on_the_disk(engine, monkeypatch):
    go, real = threading.Event(), os.fdatasync

    def held(fd: int) -> None:
        assert go.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", held)
    replies: list[dict] = []
    sql = {"sql": "SELECT COUNT(*) AS n FROM t", "notebook": "nb", "fresh": True}
    worker = threading.Thread(target=lambda: replies.append(engine.query("alice", sql)))
    worker.start()
    worker.join(0.5)  # the query itself takes a few milliseconds
    assert worker.is_alive() and not replies
    assert engine.ledger.history()[0]["status"] == "charged"  # debited, not yet released
    go.set()
    worker.join(10)
    assert replies and replies[0]["columns"] == ["n"]
    assert engine.ledger.history()[0]["status"] == "released"
