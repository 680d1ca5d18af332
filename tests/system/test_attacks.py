"""Attacks from the literature, as tests the gate passes.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_attacks.py, the dataset both use in tests/attack_data.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmagic.client.errors import DPError
from dpmagic.client.http_gate import Gate
from tests.attack_data import PEOPLE, TARGET, write_people
from tests.conftest import GateProcess

# -- no data-dependent errors ------------------------------------------------------

# The target (pid 5) is the only row with age 99 and a numeric code: each query
# would fail, overflow or behave differently on it if written naively.
HINGES = [
    "SELECT SUM(100 / (age - 99)) FROM t",
    "SELECT SUM(age % (age - 99)) FROM t",
    "SELECT COUNT(*) FROM t WHERE 10 // (age - 99) > 0",
    "SELECT COUNT(*) FROM t WHERE TRY_CAST(code AS INT) > 0",
    "SELECT SUM(TRY_CAST(code AS BIGINT)) FROM t",  # refused: no bound to declare
    "SELECT AVG(age * age * age * age) FROM t WHERE age = 99",
    "SELECT COUNT(*) FROM t WHERE CAST(code AS INT) > 0",  # refused: CAST can fail
    "SELECT COUNT(*) FROM t WHERE error('x') IS NULL",  # refused
    "SELECT COUNT(*) FROM t WHERE code ~ '^[0-9]+$'",  # refused: regexes
]


@pytest.fixture
def neighbour_gates(tmp_path: Path, short_dir: Path) -> Iterator[dict[str, GateProcess]]:
    base = [(pid, 20 + pid % 50, pid % 2, f"c{pid}") for pid in range(PEOPLE) if pid != TARGET]
    target = (TARGET, 99, 1, "12345678901234567890123")
    gates = {
        name: GateProcess(write_people(tmp_path, name, rows, 50.0), f"unix:{short_dir / name}.sock")
        for name, rows in (("with", [*base, target]), ("without", base))
    }
    try:
        for g in gates.values():
            g.start()
        yield gates
    finally:
        for g in gates.values():
            g.stop()


def _outcome(client: Gate, sql: str) -> tuple:
    try:
        r = client.query(sql, epsilon=0.2)
    except DPError as exc:
        return ("error", type(exc).__name__, str(exc))
    return ("answer", r.columns, len(r.rows), r.cost, r.budget, r.plan)


def test_failures_never_hinge_on_a_target_row(neighbour_gates):
    clients = {name: Gate(g.address) for name, g in neighbour_gates.items()}
    for sql in HINGES:
        with_it, without = (_outcome(clients[n], sql) for n in ("with", "without"))
        assert with_it == without, sql
    answered = [s for s in HINGES if _outcome(clients["with"], s)[0] == "answer"]
    # Those with total forms are answered (replayed here); the others refused on both.
    assert len(answered) == 5


# -- differencing -------------------------------------------------------------------


# -- averaging a repeated query -----------------------------------------------------


# -- reconstruction -----------------------------------------------------------------
