"""Budgets shared by many users and releases shared between them, on a real gate over
TCP with three users' tokens: what each user is charged, served and told.

ann and bob are in group ``sec-a``, cat in ``sec-b``; the dataset's own budget is
ε = 2.5, sec-a's ε = 1.5, and releases are shared within groups. The typed facts the
client reads (which budget refused, a shared answer's release) are pinned here, so a
change on either side that breaks the other fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError

from dpmagic.client.errors import BudgetExhausted
from dpmagic.client.http_gate import Gate
from dpmagic.display.budget import BudgetView, DatasetBudget
from dpmagic.gate import owner
from dpmagic.gate.policy import load_policy
from dpmagic.magics.dpsql import gate_errors
from dpmagic.protocol import BudgetName
from tests.conftest import GateProcess, free_port

TOKENS = {
    "ann": "ann-token-0123456789abc",
    "bob": "bob-token-0123456789abc",
    "cat": "cat-token-0123456789abc",
}
POLICY = """
[gate]
state_dir = "state"
response_quantum_ms = 0
tokens_file = "tokens.toml"

[groups]
sec-a = ["ann", "bob"]
sec-b = ["cat"]

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
user_budget = { epsilon = 1.0 }
dataset_budget = { epsilon = 2.5, renew = "month" }
group_budgets = { sec-a = { epsilon = 1.5 } }
share_releases = "group"

[datasets.d.tables.t.columns]
pid = { type = "int" }
age = { type = "int", lower = 0, upper = 100 }
"""
COUNT = "SELECT COUNT(*) AS n FROM t WHERE age > 30"


@pytest.fixture
def gate(tmp_path: Path):
    (tmp_path / "t.csv").write_text(
        "pid,age\n" + "".join(f"{p},{20 + p % 60}\n" for p in range(500))
    )
    (tmp_path / "tokens.toml").write_text(
        "[users]\n" + "".join(f'{u} = "{t}"\n' for u, t in TOKENS.items())
    )
    (tmp_path / "tokens.toml").chmod(0o600)
    (tmp_path / "policy.toml").write_text(POLICY)
    process = GateProcess(tmp_path / "policy.toml", f"tcp:127.0.0.1:{free_port()}")
    process.start()
    yield process
    process.stop()


def test_shared_budgets_and_releases_end_to_end(gate: GateProcess) -> None:
    ann, bob, cat = (Gate(gate.address, TOKENS[u]) for u in ("ann", "bob", "cat"))

    first = ann.query(COUNT, epsilon=0.5)
    assert first.cost["epsilon"] == pytest.approx(0.5) and first.shared is None
    budget = first.budget
    assert budget["dataset_budget"]["spent"]["epsilon"] == pytest.approx(0.5)
    assert budget["dataset_budget"]["renew"]["period"] == "month"
    assert budget["groups"]["sec-a"]["spent"]["epsilon"] == pytest.approx(0.5)
    assert budget["notebook"]["binding"]["budget"] == "user"  # 0.5 left of ann's own 1.0

    # bob, in ann's group, asks the same question in his own words: served ann's
    # release, told when and at what cost it was released, and charged to his own
    # budget only: sec-a and the dataset already count it (docs/privacy.md).
    asked = "select count(*) as n  -- bob's\nfrom t where age > 30"
    served = bob.query(asked, epsilon=0.5)
    assert served.replayed and served.cost["epsilon"] == pytest.approx(0.5)
    assert served.shared["cost"]["epsilon"] == pytest.approx(0.5)
    assert served.shared["scope"] == "group" and served.shared["released_at"]
    assert [b["budget"] for b in served.shared["charged_to"]] == ["user", "notebook"]
    assert served.rows == first.rows
    assert served.reply["request"]["sql"] == asked  # his words, not ann's
    assert "shared answer, released to another user" in str(served)
    assert served.budget["user"]["spent"]["epsilon"] == pytest.approx(0.5)
    assert served.budget["groups"]["sec-a"]["spent"]["epsilon"] == pytest.approx(0.5)
    assert served.budget["dataset_budget"]["spent"]["epsilon"] == pytest.approx(0.5)
    again = bob.query(COUNT, epsilon=0.5)  # he learned it: served again, free
    assert again.rows == first.rows and again.cost["epsilon"] == 0.0

    # cat is in another group: the same question is a new release, charged to her.
    own = cat.query(COUNT, epsilon=0.5)
    assert not own.replayed and own.shared is None
    assert own.cost["epsilon"] == pytest.approx(0.5)

    bob.query("SELECT COUNT(*) FROM t", epsilon=0.5)  # sec-a: 1.0 of 1.5
    ann.query("SELECT COUNT(*) FROM t WHERE age < 60", epsilon=0.5)  # sec-a: 1.5 of 1.5
    with pytest.raises(BudgetExhausted) as refused:
        ann.query("SELECT COUNT(*) FROM t WHERE age < 50", epsilon=0.25)
    assert refused.value.budget == BudgetName(
        **{"budget": "group", "dataset": "d", "holder": "sec-a"}
    )
    with (
        pytest.raises(UsageError, match=r"^not enough privacy budget in the budget of your group"),
        gate_errors(),
    ):
        raise refused.value

    # The dataset's budget: 0.5 (ann's release; bob's serving counts nothing more)
    # + 0.5 (cat's) + 0.5 + 0.5 + 0.5 = 2.5 of 2.5.
    cat.query("SELECT COUNT(*) FROM t WHERE age < 50", epsilon=0.5)
    with pytest.raises(BudgetExhausted) as refused:
        cat.query("SELECT COUNT(*) FROM t WHERE age < 40", epsilon=0.1)
    assert refused.value.budget == BudgetName(budget="dataset", dataset="d")
    assert "all users together" in refused.value.message

    # The owner's view: every budget, from the one implementation the CLI uses.
    policy = load_policy(gate.policy)
    with owner.open_ledger(policy) as ledger:
        rows = owner.budget_rows(policy, ledger, ["d"], None)
        shared = ledger.history(user="bob", status="replayed")
    spent = {(r["budget"], r["user"] or r["group"]): r["spent_epsilon"] for r in rows}
    assert spent[("dataset", "")] == pytest.approx(2.5)
    assert spent[("group", "sec-a")] == pytest.approx(1.5)
    assert spent[("user", "bob")] == pytest.approx(1.0)
    [free, charged] = shared  # newest first
    assert free["source"] == charged["source"] is not None
    assert (charged["epsilon"], charged["groups"]) == (0.5, [])  # sec-a counted it already
    assert free["epsilon"] == 0.0

    # What %dpbudget shows ann, from the gate's reply as it is: every budget of hers.
    view = BudgetView([DatasetBudget(ann.budget("d"), [])], "unnamed")
    shown = repr(view)
    assert "the dataset, all users together (renews each month; next" in shown
    assert "group sec-a, its members together" in shown
    assert "you, all notebooks" in shown
