"""Completion in %%dpsql cells without a gate: SQL keywords still complete, asked
through IPython's own completer as a front end asks (with a gate: tests/system)."""

# ruff: noqa: F811 - the shell fixtures are tests/shells.py's
from __future__ import annotations

from tests.shells import complete, ipython, shell  # noqa: F401


def test_without_a_gate_keywords_still_complete(shell):
    found = complete(shell, "%%dpsql\nSELECT COUNT(*) FR")
    assert found == [("FROM", "keyword")]
