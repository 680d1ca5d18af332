"""Admin tools: ``dpmagic budget show|grant|reset`` and ``dpmagic audit``, on the
ledger directly and against a running gate, whose next query must see a change."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dpmagic.commands.cli import main
from dpmagic.gate.dp.accounting import Cost, PureAccountant
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.ledger.scopes import Scope
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Budget
from dpmagic.gate.reply import Reply
from dpmagic.protocol import QueryReply
from tests.admin_cli import cli
from tests.budgets import user_limits
from tests.conftest import write_dataset

USER_CAP = Budget(1.0)
NOTEBOOK_CAP = Budget(0.6)


@pytest.fixture
def ledger(tmp_path: Path):
    led = Ledger(tmp_path / "state" / "ledger.sqlite3", PureAccountant())
    yield led
    led.close()


def charge(ledger: Ledger, epsilon: float, notebook: str = "a.ipynb", key: str | None = None):
    return ledger.debit(
        user="alice",
        dataset="d",
        notebook=notebook,
        cost=Cost(epsilon),
        limits=user_limits("d", "alice", notebook, USER_CAP, NOTEBOOK_CAP),
        sql=f"SELECT {epsilon}",
        replay_key=key,
    )


def test_a_user_grant_raises_the_user_limit_only(ledger: Ledger) -> None:
    charge(ledger, 0.5, "a.ipynb")
    charge(ledger, 0.5, "b.ipynb")
    with pytest.raises(OverBudget):
        charge(ledger, 0.1, "c.ipynb")
    ledger.grant(Scope.user("d", "alice"), Budget(2.0), "more")
    assert ledger.limit(Scope.user("d", "alice"), USER_CAP) == Budget(3.0)
    assert ledger.limit(Scope.of_notebook("d", "alice", "c.ipynb"), NOTEBOOK_CAP) == NOTEBOOK_CAP
    assert ledger.limit(Scope.user("d", "bob"), USER_CAP) == USER_CAP
    charge(ledger, 0.6, "c.ipynb")
    with pytest.raises(OverBudget, match=r"for notebook 'c\.ipynb'"):
        charge(ledger, 0.1, "c.ipynb")  # the notebook's own cap still holds
    assert ledger.spent("alice", "d") == Cost(pytest.approx(1.6))


def test_a_notebook_grant_raises_that_notebook_only(ledger: Ledger) -> None:
    charge(ledger, 0.6, "a.ipynb")
    ledger.grant(Scope.of_notebook("d", "alice", "a.ipynb"), Budget(0.2), "")
    charge(ledger, 0.2, "a.ipynb")
    with pytest.raises(OverBudget):
        charge(ledger, 0.1, "a.ipynb")
    assert ledger.limit(Scope.of_notebook("d", "alice", "b.ipynb"), NOTEBOOK_CAP) == NOTEBOOK_CAP


def test_a_reset_starts_from_zero_and_forgets_grants(ledger: Ledger) -> None:
    ledger.record_release(charge(ledger, 0.5, "a.ipynb", key="k"), Reply.of(QueryReply(rows=[[1]])))
    charge(ledger, 0.5, "b.ipynb")
    ledger.grant(Scope.user("d", "alice"), Budget(2.0), "")
    ledger.reset(Scope.user("d", "alice"), "new term")
    assert ledger.spent("alice", "d") == Cost(0.0)
    assert ledger.spent("alice", "d", "a.ipynb") == Cost(0.0)
    assert ledger.limit(Scope.user("d", "alice"), USER_CAP) == USER_CAP
    # What was released before stays replayable: it was paid for.
    assert ledger.find_release("alice", "d", "k").json()["rows"] == [[1]]
    charge(ledger, 0.6, "a.ipynb")


def test_a_notebook_reset_gives_back_nothing_of_the_user_budget(ledger: Ledger) -> None:
    charge(ledger, 0.6, "a.ipynb")
    charge(ledger, 0.4, "b.ipynb")
    ledger.reset(Scope.of_notebook("d", "alice", "a.ipynb"), "")
    assert ledger.spent("alice", "d", "a.ipynb") == Cost(0.0)
    assert ledger.spent("alice", "d") == Cost(pytest.approx(1.0))
    with pytest.raises(OverBudget, match="for user alice"):
        charge(ledger, 0.1, "a.ipynb")


def test_admin_actions_are_in_the_audit_log(ledger: Ledger) -> None:
    charge(ledger, 0.5)
    ledger.grant(Scope.user("d", "alice"), Budget(0.25), "why")
    ledger.reset(Scope.of_notebook("d", "alice", "a.ipynb"), "again")
    rows = ledger.history(user="alice")
    assert [r["status"] for r in rows] == ["reset", "granted", "charged"]
    assert rows[1]["epsilon"] == 0.25 and rows[1]["sql"] == "why"
    assert rows[0]["notebook"] == "a.ipynb"


@pytest.mark.parametrize("amount", ["-1", "nan", "inf", "lots"])
def test_a_bad_amount_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], amount: str
) -> None:
    policy = write_dataset(tmp_path)
    with pytest.raises(SystemExit) as caught:
        main(
            [
                "budget",
                "grant",
                "--policy",
                str(policy),
                "--user",
                "u",
                "--reason",
                "r",
                "--epsilon",
                amount,
            ]
        )
    assert caught.value.code == 2
    assert "argument --epsilon: " in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epsilon", "0"], "a grant needs an ε or a δ above 0"),
        (["--epsilon", "1", "--dataset", "nope"], "unknown dataset"),
    ],
)
def test_bad_grants_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    policy = write_dataset(tmp_path)
    code, _, err = cli(
        capsys, "budget", "grant", "--policy", str(policy), "--user", "u", "--reason", "r", *args
    )
    assert code == 2
    assert err.startswith("dpmagic: error: ") and message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "state").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the ledger to another user")
def test_admin_commands_refuse_another_users_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = write_dataset(tmp_path)
    state = tmp_path / "state"
    Ledger(state / "ledger.sqlite3", PureAccountant()).close()
    nobody = 65534
    for path in (state, *state.iterdir()):
        os.chown(path, nobody, nobody)
    code, _, err = cli(capsys, "budget", "show", "--policy", str(policy))
    assert code == 2
    assert "the ledger belongs to user" in err and "sudo -u" in err
    assert {p.stat().st_uid for p in state.iterdir()} == {nobody}


def test_a_groups_and_the_datasets_budgets_are_granted_and_shown_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = write_dataset(tmp_path)
    text = policy.read_text().replace(
        "[datasets.d]\n",
        "[datasets.d]\ndataset_budget = { epsilon = 20.0 }\n"
        "group_budgets = { sec-a = { epsilon = 4.0 } }\n",
        1,
    )
    policy.write_text(text)
    args = ("--policy", str(policy), "--epsilon", "1", "--reason", "term 2")
    code, out, _ = cli(capsys, "budget", "grant", "--group", "sec-a", *args)
    assert code == 0 and "granted ε=1 to the budget of group 'sec-a' on dataset 'd'" in out
    code, out, _ = cli(capsys, "budget", "grant", "--all-users", *args)
    assert code == 0 and "the dataset budget of 'd' (all users together)" in out
    code, _, err = cli(capsys, "budget", "grant", "--group", "sec-b", *args)
    assert code == 2 and "group 'sec-b' has no budget on dataset 'd'" in err
    code, out, _ = cli(capsys, "audit", "--policy", str(policy))
    lines = out.splitlines()[2:]
    assert "(all users)" in lines[0] and "(group sec-a)" in lines[1]
    code, out, _ = cli(capsys, "budget", "show", "--policy", str(policy), "--json")
    rows = {r["budget"]: r for r in json.loads(out)}
    assert rows["dataset"]["limit_epsilon"] == 21.0 and rows["group"]["limit_epsilon"] == 5.0
