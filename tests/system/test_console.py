"""``dpmagic console`` as an owner runs it, beside a real gate that charges real queries:
its pages agree with ``dpmagic budget show``, a grant made there reaches the running
gate's next query, the gate's refusals are in its log with their reasons, and what it
refuses to start on is said in one line."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmagic.client.errors import BudgetExhausted, QueryRefused
from dpmagic.client.http_gate import Gate
from dpmagic.gate import owner
from tests.admin_cli import COUNT, cli
from tests.conftest import GateProcess
from tests.consoles import Client, console_policy, console_process, seed


@pytest.fixture
def gate(tmp_path: Path, short_dir: Path) -> Iterator[GateProcess]:
    """A gate over the console's policy (a dataset, a group, renewing user budgets)."""
    process = GateProcess(console_policy(tmp_path).path, f"unix:{short_dir / 'gate.sock'}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_the_console_shows_the_gates_budgets_and_its_grant_reaches_the_gate(
    gate: GateProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    client = Gate(gate.address)
    client.query(COUNT, epsilon=2.0, notebook="a.ipynb")  # the notebook's whole budget
    with pytest.raises(BudgetExhausted):
        client.query(COUNT, epsilon=0.5, notebook="a.ipynb", fresh=True)

    with console_process(gate.policy) as console:
        browser = Client(console.base)
        assert browser.get("budgets").status == 403
        assert browser.get(console.login.split("/", 3)[3]).status == 303
        page = browser.get("budgets").body
        code, out, _ = cli(capsys, "budget", "show", "--policy", str(gate.policy), "--json")
        assert code == 0
        for row in json.loads(out):
            holder = row["group"] or row["user"]
            spent = f"{row['spent_epsilon']:.6g}"
            assert f"<td>{row['budget']}</td><td>{holder}</td>" in page
            assert f'<td class="num">{spent}</td>' in page

        form = {"dataset": "d", "budget": "notebook", "holder": owner.operator(),
                "notebook": "a.ipynb", "epsilon": "0.5", "reason": "lab 3 retake"}  # fmt: skip
        assert browser.post("grant", {**form, "_csrf": browser.csrf()}).status == 303
        log = browser.get("log?status=granted").body
        assert f"budget grant by {owner.operator()}: lab 3 retake" in log

    # The running gate's next query is charged under the raised limit.
    assert client.budget(notebook="a.ipynb")["notebook"]["limit"]["epsilon"] == 2.5
    assert client.query(COUNT, epsilon=0.5, notebook="a.ipynb", fresh=True).cost["epsilon"] == 0.5


def test_the_gates_refusals_are_in_the_console_log_with_what_their_user_was_told(
    gate: GateProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """A query over the notebook's budget and one the analysis refuses are each kept
    with the reason its user was told, charged nothing; the console lists them as
    refused, ``dpmagic audit`` too; the user's own history and budget do not change."""
    client = Gate(gate.address)
    client.query(COUNT, epsilon=2.0, notebook="a.ipynb")
    before = client.budget(notebook="a.ipynb")["notebook"]["spent"]
    told = []
    for sql, epsilon, error in [
        (COUNT, 0.5, BudgetExhausted),
        ("SELECT * FROM t", 0.1, QueryRefused),
    ]:
        with pytest.raises(error) as refused:
            client.query(sql, epsilon=epsilon, notebook="a.ipynb", fresh=True)
        told.append((sql, str(refused.value)))
    with pytest.raises(QueryRefused):  # a dry run is not kept, refused or not
        client.query("SELECT * FROM t", notebook="a.ipynb", dry_run=True)
    assert client.budget(notebook="a.ipynb")["notebook"]["spent"] == before
    history = client.history(notebook="a.ipynb")["entries"]
    assert [e["status"] for e in history] == ["released"]

    with console_process(gate.policy) as console:
        browser = Client(console.base)
        assert browser.get(console.login.split("/", 3)[3]).status == 303
        page = browser.get("log?status=refused").body
    rows = re.findall(r'<div class="sql">(.*?)</div></td>', page, re.S)
    assert len(rows) == 2
    for (sql, message), row in zip(reversed(told), rows, strict=True):
        text = html.unescape(re.sub(r"<[^>]+>", " ", row))
        assert sql in text
        # the reason as the gate wrote it; the client prefixes its own words
        reason = text.split("refused: ", 1)[1].strip()
        assert reason and reason in message, (reason, message)

    code, out, _ = cli(capsys, "audit", "--policy", str(gate.policy), "--json")
    assert code == 0
    audited = [r for r in json.loads(out) if r["status"] == "refused"]
    assert [r["sql"] for r in audited] == [sql for sql, _ in reversed(told)]
    assert all(r["epsilon"] == 0 and r["reason"] for r in audited)


def run_console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dpmagic", "console", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_console_refuses_an_open_admin_tokens_file(tmp_path: Path) -> None:
    policy = console_policy(tmp_path).path
    tokens = tmp_path / "admins.toml"
    tokens.write_text('[users]\nops = "ops-admin-token-0123456789abcdef"\n')
    tokens.chmod(0o640)
    done = run_console("--policy", str(policy), "--port", "0", "--admin-token-file", str(tokens))
    assert done.returncode == 2
    assert done.stderr.startswith("dpmagic: error: tokens file ")
    assert "chmod 600" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.hub  # run where the hub extra is installed (.ci/run's Hub stage)
def test_the_console_on_jupyterhub_needs_to_be_a_hub_service(tmp_path: Path) -> None:
    policy = console_policy(tmp_path).path
    done = run_console("--policy", str(policy), "--jupyterhub")
    assert done.returncode == 2
    assert "--jupyterhub runs the console as a Hub service" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the ledger to another user")
def test_the_console_refuses_another_users_ledger(tmp_path: Path) -> None:
    policy = console_policy(tmp_path)
    seed(policy)
    os.chown(policy.gate.state_dir / owner.LEDGER_FILE, 65534, 65534)
    done = run_console("--policy", str(policy.path), "--port", "0")
    assert done.returncode == 2
    assert done.stderr.startswith("dpmagic: error: the ledger belongs to user ")
