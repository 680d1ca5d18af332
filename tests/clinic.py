"""The clinic example as the CLI's tests use it: its CSV files (``clinic_csv``, 60
patients) and a gate's policy whose ledger holds real queries (``spent_gate``, one
per module: two charged, one replayed). Shared by tests/unit/test_cli.py and
tests/system/test_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmagic.client.http_gate import Gate
from dpmagic.commands.demo import GateProcess, prepare_example
from dpmagic.examples.clinic import generate


@pytest.fixture
def clinic_csv(tmp_path: Path) -> dict[str, Path]:
    return generate(tmp_path / "clinic", patients=60)


@pytest.fixture(scope="module")
def spent_gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gate's policy whose ledger holds real queries: two charged, one replayed."""
    workdir = tmp_path_factory.mktemp("ledger")
    policy = prepare_example(workdir, patients=80)
    with GateProcess(policy, workdir / "gate.sock", workdir / "gate.log") as gate:
        client = Gate(gate.address)
        client.query("SELECT COUNT(*) AS n FROM visits", epsilon=0.25, notebook="a.ipynb")
        client.query("SELECT COUNT(*) AS n FROM visits", epsilon=0.25, notebook="a.ipynb")
        client.query(
            "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", epsilon=0.5, notebook="b.ipynb"
        )
    return policy
