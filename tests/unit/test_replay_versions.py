"""Nothing stale: an answer is replayed only over the data and the policy facts it was
computed from. The replay key carries the dataset's versions (``engines/versions.versions``),
so after the data file or a bound the query read changes, the same query is answered
afresh, charged, and the reply says why (``fresh_because``); an unchanged restart
still replays, and so does a change the query never read."""

from __future__ import annotations

import sqlite3
import textwrap
from pathlib import Path

import pytest

from dpmagic.display.result import DPResult
from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.ledger import replays, schema
from dpmagic.gate.ledger.replays import ReplayKey
from tests.gate_helpers import write_gate

POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = {{ t = "t.csv", u = "u.csv" }}
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = {user_budget} }}
notebook_budget = {{ epsilon = 2.0 }}
query_default = {{ epsilon = 0.5 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = {upper} }}
sex = {{ type = "int", public_values = [0, 1] }}

[datasets.d.tables.u.columns]
pid = {{ type = "int" }}
score = {{ type = "int", lower = 0, upper = {score_upper} }}
"""
QUERY = {"sql": "SELECT sex, COUNT(*) AS n, AVG(age) AS a FROM t GROUP BY sex", "notebook": "nb"}


def _write(folder: Path, rows: int | None = 6366, **facts: float) -> None:
    """The policy (``facts`` change its numbers) and, unless ``rows`` is None, the data
    files, ``t`` with ``rows`` rows."""
    values = {"upper": 100, "score_upper": 10, "user_budget": 10.0, **facts}
    tables = None
    if rows is not None:
        people = [(i // 2, (i * 37) % 90, i % 2) for i in range(rows)]
        tables = {"t": ("pid,age,sex", people), "u": ("pid,score", [(i, i % 10) for i in range(9)])}
    write_gate(folder, textwrap.dedent(POLICY.format(**values)), tables)


def _ask(folder: Path, body: dict | None = None) -> dict:
    """``QUERY`` asked of a gate started on ``folder`` as it is now, then stopped."""
    engine = Engine(_load(folder))
    try:
        return engine.query("alice", body or QUERY)
    finally:
        engine.close()


def _load(folder: Path):
    from dpmagic.gate.policy import load_policy

    return load_policy(folder / "policy.toml")


def _spent(folder: Path) -> float:
    engine = Engine(_load(folder))
    try:
        return engine.budget("alice", None, "nb")["notebook"]["spent"]["epsilon"]
    finally:
        engine.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    _write(tmp_path)
    return tmp_path


def test_the_same_query_replays_within_a_start_and_after_an_unchanged_restart(folder):
    engine = Engine(_load(folder))
    try:
        first = engine.query("alice", QUERY)
        again = engine.query("alice", QUERY)
    finally:
        engine.close()
    assert first["replayed"] is False and "fresh_because" not in first
    assert again["replayed"] is True and again["rows"] == first["rows"]
    restarted = _ask(folder)
    assert restarted["replayed"] is True and restarted["rows"] == first["rows"]
    assert "fresh_because" not in restarted
    assert _spent(folder) == pytest.approx(0.5)


def test_a_changed_data_file_answers_afresh_and_says_why(folder):
    first = _ask(folder)
    _write(folder, rows=3000)  # the file cut to 3,000 rows: the gate prepares it anew
    fresh = _ask(folder)
    assert fresh["replayed"] is False
    assert fresh["fresh_because"] == "the dataset changed since your earlier answer"
    # and the footer a user reads says so
    assert "answered afresh: the dataset changed" in DPResult(fresh).footer()
    assert fresh["cost"]["epsilon"] == 0.5 and _spent(folder) == pytest.approx(1.0)
    assert fresh["rows"] != first["rows"]
    # The new answer is the one replayed from now on, and its replay is not "fresh".
    again = _ask(folder)
    assert again["replayed"] is True and again["rows"] == fresh["rows"]
    assert "fresh_because" not in again


def test_a_changed_bound_answers_afresh_and_the_footer_names_the_new_bound(folder):
    first = _ask(folder)
    assert "[0, 100]" in first["bounding"]["text"]
    _write(folder, rows=None, upper=50)  # the policy only; the data files are untouched
    fresh = _ask(folder)
    assert fresh["replayed"] is False
    assert fresh["fresh_because"] == "the policy changed since your earlier answer"
    assert "[0, 50]" in fresh["bounding"]["text"] and "[0, 100]" not in fresh["bounding"]["text"]
    assert _spent(folder) == pytest.approx(1.0)


def test_both_changed_are_both_named(folder):
    _ask(folder)
    _write(folder, rows=3000, upper=50)
    assert _ask(folder)["fresh_because"] == (
        "the dataset and the policy changed since your earlier answer"
    )


def test_a_change_the_query_did_not_read_still_replays(folder):
    """A budget, or a bound of a table the query does not scan, is no fact of its answer."""
    first = _ask(folder)
    _write(folder, rows=None, user_budget=20.0, score_upper=20)
    again = _ask(folder)
    assert again["replayed"] is True and again["rows"] == first["rows"]
    # A query over ``u`` does read that bound.
    scores = {"sql": "SELECT AVG(score) FROM u", "notebook": "nb"}
    _ask(folder, scores)
    _write(folder, rows=None, user_budget=20.0, score_upper=30)
    assert _ask(folder, scores)["fresh_because"] == "the policy changed since your earlier answer"


def test_asking_fresh_says_no_reason(folder):
    _ask(folder)
    _write(folder, rows=3000)
    assert "fresh_because" not in _ask(folder, {**QUERY, "fresh": True})


def test_an_over_budget_refusal_says_why_the_query_is_not_replayed(folder):
    _write(folder, user_budget=0.5)
    _ask(folder)
    _write(folder, rows=3000, user_budget=0.5)
    with pytest.raises(OverBudget) as refused:
        _ask(folder)
    assert refused.value.message.endswith(
        "; not replayed: the dataset changed since your earlier answer"
    )


def test_a_key_without_the_versions_is_caught(folder, monkeypatch):
    """The broken version, a replay key of the query alone, replays the answer computed
    from the old file: the checks above fail on it."""
    original = Engine._replay_key

    def unversioned(self, dataset, the_plan, request):
        key = original(self, dataset, the_plan, request)
        return ReplayKey(key.query, "", "")

    monkeypatch.setattr(Engine, "_replay_key", unversioned)
    first = _ask(folder)
    _write(folder, rows=3000)
    stale = _ask(folder)
    assert stale["replayed"] is True and stale["rows"] == first["rows"]
    assert "fresh_because" not in stale


def test_an_older_ledger_opens_and_its_releases_are_answered_afresh_with_a_reason(folder):
    """A ledger made before versions has no replay_keys table, and its releases were
    keyed by the query alone: it opens as it was, and the gate cannot tell whether the
    data changed since such a release, so it answers afresh and says so."""
    original = Engine._replay_key
    engine = Engine(_load(folder))
    try:
        dataset = engine.policy.dataset("d")
        plan = engine.analysis("alice", dataset, _request()).plan
        query_key = original(engine, dataset, plan, _request()).query
    finally:
        engine.close()
    path = folder / "state" / "ledger.sqlite3"
    with sqlite3.connect(path) as db:  # as an earlier release left it
        db.execute("DROP TABLE replay_keys")
        db.execute("PRAGMA user_version = 1")
        db.execute(
            "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
            " replay_key, status, reply) VALUES ('2026-01-01T00:00:00+00:00', 'alice', 'd',"
            " 'nb', 0.5, 0, 0, ?, ?, 'released', '{\"rows\": [[0, 1, 2.0]]}')",
            (QUERY["sql"], query_key),
        )
    fresh = _ask(folder)
    assert fresh["replayed"] is False and fresh["fresh_because"] == replays.UNVERSIONED
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    assert _ask(folder)["replayed"] is True


def _request():
    from dpmagic.gate.request import QueryRequest

    return QueryRequest.from_body(QUERY)
