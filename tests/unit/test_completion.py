"""Completion in %%dpsql cells without a gate: SQL keywords still complete, asked
through IPython's own completer as a front end asks (with a gate: tests/system)."""

# ruff: noqa: F811 - the shell fixtures are test_magics.py's
from __future__ import annotations

from IPython.core.completer import provisionalcompleter
from IPython.core.interactiveshell import InteractiveShell

from tests.unit.test_magics import ipython, shell  # noqa: F401


def complete(shell: InteractiveShell, text: str, cursor: int | None = None) -> list[tuple]:
    at = len(text) if cursor is None else cursor
    with provisionalcompleter():
        found = shell.Completer.completions(text, at)
        return [(c.text, c.type) for c in found]


def test_without_a_gate_keywords_still_complete(shell):
    found = complete(shell, "%%dpsql\nSELECT COUNT(*) FR")
    assert found == [("FROM", "keyword")]
