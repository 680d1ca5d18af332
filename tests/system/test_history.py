"""``GET /v1/history`` on a real gate, and ``%dpbudget`` built on it."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from dpmagic.client.errors import DPError, QueryRefused
from dpmagic.client.http_gate import Gate
from dpmagic.magics.dpsql import DpSql, register
from tests.conftest import TOKENS

COUNT = "SELECT COUNT(*) AS n FROM t"
BY_SEX = "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex"


def test_history_is_this_notebooks_queries_oldest_first(gate):
    client = Gate(gate.address)
    client.query(COUNT, epsilon=0.5, notebook="a.ipynb")
    client.query(BY_SEX, epsilon=0.25, notebook="b.ipynb")
    client.query(COUNT, epsilon=0.5, notebook="a.ipynb")  # replayed
    client.query(BY_SEX, epsilon=0.25, notebook="a.ipynb", dry_run=True)  # not run, not kept
    with pytest.raises(QueryRefused):
        client.query("SELECT pid FROM t", notebook="a.ipynb")  # refused, not kept
    reply = client.history(notebook="a.ipynb")
    assert reply["datasets"] == ["d"] and reply["notebook"] == "a.ipynb"
    entries = reply["entries"]
    assert [(e["sql"], e["status"], e["replayed"]) for e in entries] == [
        (COUNT, "released", False),
        (COUNT, "replayed", True),
    ]
    assert [e["cost"]["epsilon"] for e in entries] == [0.5, 0.0]
    assert entries[0]["time"] < entries[1]["time"]
    assert all(e["dataset"] == "d" for e in entries)
    # The reply carries no answer: only what the user asked and what it cost.
    assert set(entries[0]) == {"time", "dataset", "sql", "cost", "status", "replayed"}
    assert [e["sql"] for e in client.history("d", "b.ipynb")["entries"]] == [BY_SEX]
    assert client.history(notebook="never.ipynb")["entries"] == []


def test_history_limit_keeps_the_newest(gate):
    client = Gate(gate.address)
    for epsilon in (0.1, 0.2, 0.3):
        client.query(COUNT, epsilon=epsilon, notebook="n")
    entries = client.history(notebook="n", limit=2)["entries"]
    assert [e["cost"]["epsilon"] for e in entries] == [0.2, 0.3]
    for bad in (0, 1001):
        with pytest.raises(DPError, match="limit must be a whole number from 1 to 1000"):
            client.history(notebook="n", limit=bad)
    with pytest.raises(DPError, match="unknown dataset 'nope'"):
        client.history("nope", "n")


def test_history_is_the_callers_own(tcp_gate):
    alice = Gate(tcp_gate.address, TOKENS["alice"])
    bob = Gate(tcp_gate.address, TOKENS["bob"])
    alice.query(COUNT, epsilon=0.5, notebook="shared-name.ipynb")
    assert len(alice.history(notebook="shared-name.ipynb")["entries"]) == 1
    assert bob.history(notebook="shared-name.ipynb")["entries"] == []


@pytest.fixture
def shell(gate, monkeypatch) -> InteractiveShell:
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ipython = InteractiveShell.instance(config=config)
    monkeypatch.setenv("JPY_SESSION_NAME", "hw.ipynb")
    ipython.configurables[:] = [c for c in ipython.configurables if not isinstance(c, DpSql)]
    register(ipython)
    ipython.run_line_magic("config", f"DpSql.gate = {gate.address!r}")
    return ipython


def test_dpbudget_shows_spending_history_and_chart(shell, gate):
    shell.run_cell_magic("dpsql", "-e 0.5", COUNT)
    shell.run_cell_magic("dpsql", "-e 0.5", COUNT)
    shell.run_cell_magic("dpsql", "-e 0.25", BY_SEX)
    Gate(gate.address).query(COUNT, epsilon=1.0, notebook="other.ipynb")
    view = shell.run_line_magic("dpbudget", "")
    (entry,) = view.datasets
    assert entry.name == "d"
    assert entry.budget["notebook"]["spent"]["epsilon"] == pytest.approx(0.75)
    assert entry.budget["user"]["spent"]["epsilon"] == pytest.approx(1.75)
    assert [(e["sql"].strip(), e["status"]) for e in entry.history] == [
        (COUNT, "released"),
        (COUNT, "replayed"),
        (BY_SEX, "released"),
    ]
    html = view._repr_html_()
    assert html.count("<code>") == 3 and "replayed" in html and "ε 0" in html
    assert html.count('role="meter"') == 2 and "<svg" in html
    text = repr(view)
    assert "you, all notebooks" in text and "notebook hw.ipynb" in text
    with pytest.raises(Exception, match="takes only --dataset"):
        shell.run_line_magic("dpbudget", "extra")
