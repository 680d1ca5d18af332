"""Admin tools: ``dpmagic budget show|grant|reset`` and ``dpmagic audit``, on the ledger
directly and against a running gate, whose next query must see a change.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject,
and the helpers used here, are in tests/unit/test_admin.py."""

from __future__ import annotations

import getpass
import json

import pytest

from dpmagic.client.errors import BudgetExhausted
from dpmagic.client.http_gate import Gate
from tests.admin_cli import COUNT, cli
from tests.conftest import GateProcess


def budget(gate: GateProcess, notebook: str = "a.ipynb") -> dict:
    return Gate(gate.address).budget(notebook=notebook)


def test_grant_and_reset_reach_a_running_gate(
    gate: GateProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = str(gate.policy)
    client = Gate(gate.address)
    client.query(COUNT, epsilon=2.0, notebook="a.ipynb")  # the notebook's whole budget
    with pytest.raises(BudgetExhausted):
        client.query(COUNT, epsilon=0.5, notebook="a.ipynb", fresh=True)

    code, out, _ = cli(
        capsys, "budget", "grant", "--policy", policy, "--user", getpass.getuser(),
        "--notebook", "a.ipynb", "--epsilon", "0.5", "--note", "lab 3 retake",
    )  # fmt: skip
    assert code == 0 and "granted ε=0.5 to the budget of notebook 'a.ipynb'" in out
    assert budget(gate)["notebook"]["limit"]["epsilon"] == pytest.approx(2.5)
    result = client.query(COUNT, epsilon=0.5, notebook="a.ipynb", fresh=True)
    assert result.cost["epsilon"] == pytest.approx(0.5)
    assert budget(gate)["user"]["spent"]["epsilon"] == pytest.approx(2.5)

    code, out, _ = cli(
        capsys, "budget", "reset", "--policy", policy, "--user", getpass.getuser(),
        "--reason", "new term",
    )  # fmt: skip
    assert code == 0 and out.startswith("reset the budget of user")
    after = budget(gate)
    assert after["user"]["spent"]["epsilon"] == 0.0
    assert after["notebook"]["limit"]["epsilon"] == pytest.approx(2.0)  # the grant is gone
    assert client.query(COUNT, epsilon=2.0, notebook="a.ipynb").replayed  # still free

    code, out, _ = cli(capsys, "audit", "--policy", policy, "--json")
    rows = json.loads(out)
    assert [r["status"] for r in rows[:3]] == ["replayed", "reset", "released"]
    grant = next(r for r in rows if r["status"] == "granted")
    assert grant["sql"] == f"budget grant by {getpass.getuser()}: lab 3 retake"
    assert grant["epsilon"] == 0.5 and grant["notebook"] == "a.ipynb"

    code, out, _ = cli(capsys, "audit", "--policy", policy, "--notebook", "a.ipynb")
    lines = out.splitlines()
    assert lines[0].split() == ["id", "time", "user", "dataset", "notebook", "epsilon", "status",
                                "sql"]  # fmt: skip
    assert any("granted" in line and "lab 3 retake" in line for line in lines)
    assert all("a.ipynb" in line for line in lines[2:])

    code, out, _ = cli(capsys, "budget", "show", "--policy", policy, "--json")
    rows = json.loads(out)
    assert {r["notebook"] for r in rows} == {"(all notebooks)", "a.ipynb"}
    whole = next(r for r in rows if r["notebook"] == "(all notebooks)")
    assert whole["spent_epsilon"] == 0.0 and whole["remaining_epsilon"] == pytest.approx(5.0)
