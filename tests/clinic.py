"""The clinic example as the CLI's tests use it: its CSV files (``clinic_csv``, 60
patients) and a gate's policy whose ledger holds real queries (``spent_gate``, one
per module: two charged, one replayed). Shared by tests/unit/test_cli.py and
tests/system/test_cli.py.

The ledger is filled by the ``Engine`` a gate process serves, in this process and as
this process's user (the name a gate reads from ``SO_PEERCRED``): the tests that use
it read the ledger back through the admin commands, and starting a gate process only
to fill it cost seconds of a unit run."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from dpmagic.commands.demo import prepare_example
from dpmagic.examples.clinic import generate
from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy


@pytest.fixture
def clinic_csv(tmp_path: Path) -> dict[str, Path]:
    return generate(tmp_path / "clinic", patients=60)


@pytest.fixture(scope="module")
def spent_gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gate's policy whose ledger holds real queries: two charged, one replayed."""
    workdir = tmp_path_factory.mktemp("ledger")
    policy = prepare_example(workdir, patients=80)
    me = pwd.getpwuid(os.getuid()).pw_name
    engine = Engine(load_policy(policy))
    try:
        for sql, epsilon, notebook in (
            ("SELECT COUNT(*) AS n FROM visits", 0.25, "a.ipynb"),
            ("SELECT COUNT(*) AS n FROM visits", 0.25, "a.ipynb"),
            ("SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", 0.5, "b.ipynb"),
        ):
            engine.query(me, {"sql": sql, "epsilon": epsilon, "notebook": notebook})
    finally:
        engine.close()
    return policy
