"""dpmagic.budget_status, as the JupyterLab extension asks for it: a user expression of a
silent execute request, in a real IPython shell against a real gate process."""

# ruff: noqa: F811 - the shell fixtures are tests/shells.py's

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from dpmagic.budget_status import MIME_TYPE
from dpmagic.client.http_gate import Gate
from dpmagic.magics.dpsql import DpSql
from tests.shells import COUNT_BY_SEX, ipython, shell  # noqa: F401

# What labextension/src/index.ts sends as the request's only user expression.
EXPRESSION = "__import__('dpmagic.budget_status').budget_status.status()"


def _ask(shell: InteractiveShell) -> dict:
    """The status as the extension reads it from the execute reply."""
    reply = shell.user_expressions({"budget": EXPRESSION})["budget"]
    assert reply["status"] == "ok", reply
    return reply["data"][MIME_TYPE]


def test_the_status_is_the_gates_budget_reply_and_costs_nothing(shell, gate, capsys):
    shell.run_line_magic("config", f"DpSql.gate = {gate.address!r}")
    names = dict(shell.user_ns)
    status = _ask(shell)
    assert shell.user_ns == names  # asking stores nothing in the notebook's namespace
    assert status["state"] == "ok"
    assert status["datasets"] == ["d"]
    client = Gate(gate.address)
    assert status["budgets"] == [client.budget("d", status["notebook"])]
    assert status["budgets"][0]["notebook"]["remaining"]["epsilon"] == 2.0
    assert status["budgets"][0]["user"]["remaining"]["epsilon"] == 5.0

    shell.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    capsys.readouterr()
    after = _ask(shell)
    assert after["budgets"] == [client.budget("d", status["notebook"])]
    assert after["budgets"][0]["notebook"]["remaining"]["epsilon"] == pytest.approx(1.5)
    assert after["budgets"][0]["user"]["remaining"]["epsilon"] == pytest.approx(4.5)
    # Asking charged nothing and printed nothing.
    assert _ask(shell)["budgets"] == after["budgets"]
    assert client.history("d", status["notebook"])["entries"][-1]["cost"]["epsilon"] == 0.5
    assert len(client.history("d", status["notebook"])["entries"]) == 1
    assert capsys.readouterr() == ("", "")


def test_without_a_gate_the_status_says_why(shell, short_dir: Path):
    shell.run_line_magic("config", f"DpSql.gate = 'unix:{short_dir / 'nobody.sock'}'")
    status = _ask(shell)
    assert status["state"] == "error" and status["kind"] == "unavailable"
    assert "no gate answers at" in status["message"]


def test_without_the_magics_no_gate_is_asked(ipython: InteractiveShell):
    registry = ipython.magics_manager.registry
    saved = registry.pop("DpSql", None)
    try:
        assert _ask(ipython) == {"state": "not_loaded"}
    finally:
        if saved is not None:
            registry["DpSql"] = saved
    assert saved is None or isinstance(saved, DpSql)
