"""The client against a real gate process: answers, replay, refusals, budget, outages.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject,
and the helpers used here, are in tests/unit/test_client.py."""

from __future__ import annotations

import re

import pytest

from dpmagic.client.errors import AuthError, BudgetExhausted, DPError, QueryRefused
from dpmagic.client.http_gate import Gate
from tests.conftest import TOKENS
from tests.shells import COUNT_BY_SEX


def test_health_schema_and_fresh_budget(gate):
    client = Gate(gate.address)
    assert client.health() is True
    schema = client.schema()
    assert schema["dataset"] == "d"
    assert schema["privacy_unit"] == "pid"
    assert schema["tables"]["t"]["columns"]["age"] == {"type": "int", "lower": 0, "upper": 100}
    budget = client.budget(notebook="nb.ipynb")
    assert budget["user"]["spent"]["epsilon"] == 0
    assert budget["user"]["remaining"]["epsilon"] == 5.0
    assert budget["notebook"]["remaining"]["epsilon"] == 2.0


def test_query_returns_noisy_rows_cost_and_budget(gate):
    result = Gate(gate.address).query(COUNT_BY_SEX, epsilon=0.5, notebook="nb.ipynb")
    assert result.columns == ["sex", "n"]
    assert [row[0] for row in result.rows] == [0, 1]
    assert result.cost["epsilon"] == pytest.approx(0.5)
    assert not result.replayed and not result.dry_run
    assert result.budget["notebook"]["remaining"]["epsilon"] == pytest.approx(1.5)
    assert result.budget["user"]["remaining"]["epsilon"] == pytest.approx(4.5)
    assert result.accuracy["columns"][0] is None
    lo, hi = result.interval("n").iloc[0][["lower", "upper"]]
    assert lo < hi
    # 100 people of each sex; the noise at ε 0.5 is far smaller than 100
    assert all(0 < n < 200 for n in result.df["n"])


def test_same_query_is_replayed_at_no_cost_and_fresh_spends(gate):
    client = Gate(gate.address)
    first = client.query(COUNT_BY_SEX, epsilon=0.5, notebook="nb.ipynb")
    again = client.query(COUNT_BY_SEX, epsilon=0.5, notebook="nb.ipynb")
    assert again.replayed
    assert again.cost["epsilon"] == 0
    assert again.rows == first.rows
    assert again.budget["user"]["remaining"]["epsilon"] == pytest.approx(4.5)
    fresh = client.query(COUNT_BY_SEX, epsilon=0.5, notebook="nb.ipynb", fresh=True)
    assert not fresh.replayed
    assert fresh.budget["user"]["remaining"]["epsilon"] == pytest.approx(4.0)


def test_dry_run_shows_the_plan_and_charges_nothing(gate):
    client = Gate(gate.address)
    result = client.query("SELECT COUNT(*) AS n, SUM(age) AS s FROM t", epsilon=1.0, dry_run=True)
    assert result.dry_run and result.rows == []
    assert result.cost["epsilon"] == pytest.approx(1.0)
    # two noisy aggregates, then the two output columns' expected errors
    assert [s["kind"] for s in result.plan] == ["count", "sum", "output", "output"]
    assert {"aggregate", "sensitivity", "mechanism", "scale", "epsilon"} <= set(result.plan[0])
    assert client.budget()["user"]["spent"]["epsilon"] == 0


def test_parameters_are_bound_by_the_gate(gate):
    result = Gate(gate.address).query(
        "SELECT COUNT(*) AS n FROM t WHERE age >= $min_age", epsilon=1.0, params={"min_age": 70}
    )
    # ages 70..79: 10 of every 60 people
    assert result.columns == ["n"]
    assert 0 <= result.rows[0][0] < 120


def test_refusal_raises_query_refused_with_the_reason_and_costs_nothing(gate):
    client = Gate(gate.address)
    with pytest.raises(QueryRefused) as refused:
        client.query("SELECT pid FROM t", epsilon=0.5)
    assert refused.value.kind == "refused"
    assert "pid" in refused.value.message
    assert "\n" not in refused.value.message
    assert client.budget()["user"]["spent"]["epsilon"] == 0


def test_budget_exhaustion_says_what_is_needed_and_left(gate):
    client = Gate(gate.address)
    client.query(COUNT_BY_SEX, epsilon=1.5, notebook="a.ipynb")
    with pytest.raises(BudgetExhausted) as exhausted:
        client.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0, notebook="a.ipynb")
    message = exhausted.value.message
    assert exhausted.value.kind == "budget"
    assert re.search(r"\b1(\.0+)?\b", message), message
    assert re.search(r"\b0\.50*\b", message), message
    # the refused query cost nothing
    assert client.budget(notebook="a.ipynb")["notebook"]["spent"]["epsilon"] == 1.5


def test_notebooks_draw_on_one_user_budget(gate):
    client = Gate(gate.address)
    client.query(COUNT_BY_SEX, epsilon=2.0, notebook="a.ipynb")
    # the same query in another notebook would be replayed for free: ask it afresh
    client.query(COUNT_BY_SEX, epsilon=2.0, notebook="b.ipynb", fresh=True)
    with pytest.raises(BudgetExhausted):
        client.query(COUNT_BY_SEX, epsilon=1.5, notebook="c.ipynb")
    left = client.budget(notebook="c.ipynb")
    assert left["user"]["remaining"]["epsilon"] == pytest.approx(1.0)
    assert left["notebook"]["remaining"]["epsilon"] == pytest.approx(1.0)


def test_bad_request_keeps_its_kind(gate):
    with pytest.raises(DPError) as bad:
        Gate(gate.address).query(COUNT_BY_SEX, epsilon=-1.0)
    assert bad.value.kind == "bad_request"
    assert not isinstance(bad.value, QueryRefused | BudgetExhausted)


def test_tcp_gate_charges_the_user_the_token_names(tcp_gate):
    alice = Gate(tcp_gate.address, token=TOKENS["alice"])
    assert alice.query(COUNT_BY_SEX, epsilon=0.5).cost["epsilon"] == pytest.approx(0.5)
    assert alice.budget()["user"]["spent"]["epsilon"] == pytest.approx(0.5)
    bob = Gate(tcp_gate.address, token=TOKENS["bob"])
    assert bob.budget()["user"]["spent"]["epsilon"] == 0


def test_tcp_gate_refuses_a_missing_or_wrong_token(tcp_gate, monkeypatch):
    monkeypatch.delenv("DPMAGIC_TOKEN", raising=False)
    with pytest.raises(AuthError) as missing:
        Gate(tcp_gate.address).query(COUNT_BY_SEX, epsilon=0.5)
    assert missing.value.kind == "auth"
    with pytest.raises(AuthError):
        Gate(tcp_gate.address, token="not-a-token-of-this-gate").budget()
    monkeypatch.setenv("DPMAGIC_TOKEN", TOKENS["bob"])
    assert Gate(tcp_gate.address).budget()["user"]["spent"]["epsilon"] == 0


def test_address_comes_from_the_environment(gate, monkeypatch):
    monkeypatch.setenv("DPMAGIC_GATE", gate.address)
    assert Gate().health() is True
