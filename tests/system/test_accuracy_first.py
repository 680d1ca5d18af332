"""Accuracy first: ``accuracy=A`` buys the least cost at which every noisy cell's (1 -
alpha) interval is ±A, and the interval holds at its stated rate.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_accuracy_first.py."""

from __future__ import annotations

import pytest


def test_client_and_magic_ask_for_accuracy_through_a_real_gate(gate):
    from IPython.core.error import UsageError

    from dpmagic.client.http_gate import Gate
    from dpmagic.magics.dpsql import parse_line

    result = Gate(gate.address).query(
        "SELECT sex, COUNT(*) FROM t GROUP BY sex", accuracy=8.0, alpha=0.1, dry_run=True
    )
    assert result.dry_run and result.plan[0]["requested"]["half_width"] <= 8.0
    assert result.cost["epsilon"] > 0
    opts, rest = parse_line("--accuracy 8 --alpha 0.1 SELECT COUNT(*) FROM t")
    assert (opts.accuracy, opts.alpha, rest) == (8.0, 0.1, "SELECT COUNT(*) FROM t")
    with pytest.raises(UsageError, match="between 0 and 1"):
        parse_line("--accuracy 8 --alpha 2 SELECT 1")


@pytest.fixture
def dpsql_shell(gate, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from dpmagic.magics.dpsql import DpSql, register

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    shell.configurables[:] = [c for c in shell.configurables if not isinstance(c, DpSql)]
    register(shell)
    shell.run_line_magic("config", f"DpSql.gate = {gate.address!r}")
    return shell


def test_dry_run_magic_shows_the_plan_per_aggregate(dpsql_shell):
    result = dpsql_shell.run_cell_magic(
        "dpsql", "--dry-run --accuracy 10", "SELECT sex, SUM(age) AS s FROM t GROUP BY sex"
    )
    text = repr(result)
    for header in ("bounds", "sensitivity", "mechanism", "cost", "95% error ±", "keys"):
        assert header in text
    step = result.plan[0]
    assert step["bounds"] == [0, 100] and step["keys"][0]["column"] == "sex"
    assert "[0, 100]" in text and "sex (2 public)" in text and "discrete_laplace" in text
    assert step["accuracy"] <= 10.0
    assert result.footer().startswith("dry run: nothing charged")
    assert result.budget["user"]["spent"]["epsilon"] == 0.0
