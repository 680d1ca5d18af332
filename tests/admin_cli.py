"""The admin commands run as a user runs them (``dpmagic budget …``, ``dpmagic audit``),
and the query the admin tests charge, shared by their unit and system tests."""

from __future__ import annotations

import pytest

from dpmagic.commands.cli import main

COUNT = "SELECT COUNT(*) AS n FROM t"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err
