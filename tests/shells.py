"""Real IPython shells with the magics loaded, as the magic and completion tests use
them: the ``ipython`` shell (one per module), ``shell`` (the extension loaded afresh,
no gate configured), ``connected`` (the same, on the ``gate`` fixture's gate), a cell
they run (``COUNT_BY_SEX``) and ``complete``, which asks IPython's own completer as a
front end asks. Shared by test_magics, test_completion and test_budget_status in
tests/unit/ and tests/system/."""

from __future__ import annotations

import pytest
from IPython.core.completer import provisionalcompleter
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from dpmagic.magics.dpsql import DpSql, register

COUNT_BY_SEX = "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex ORDER BY sex"


@pytest.fixture(scope="module")
def ipython() -> InteractiveShell:
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    return InteractiveShell.instance(config=config)


@pytest.fixture
def shell(ipython: InteractiveShell, monkeypatch) -> InteractiveShell:
    """The shell with the extension loaded afresh and no gate configured."""
    monkeypatch.delenv("DPMAGIC_GATE", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    ipython.user_ns.pop("__session__", None)
    ipython.configurables[:] = [c for c in ipython.configurables if not isinstance(c, DpSql)]
    register(ipython)
    return ipython


@pytest.fixture
def connected(shell: InteractiveShell, gate) -> InteractiveShell:
    shell.run_line_magic("config", f"DpSql.gate = {gate.address!r}")
    return shell


def complete(shell: InteractiveShell, text: str, cursor: int | None = None) -> list[tuple]:
    at = len(text) if cursor is None else cursor
    with provisionalcompleter():
        found = shell.Completer.completions(text, at)
        return [(c.text, c.type) for c in found]
