"""Budget integrity against a real gate process: racing clients (threads and processes)
never overspend, ``kill -9`` between the debit and the reply leaves the debit recorded
and the ledger readable, the ledger and audit log survive restarts, and what a query
costs never depends on the data.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_budget_integrity.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pytest

from dpmagic import BudgetExhausted
from dpmagic.client.http_gate import Gate
from tests.conftest import GateProcess, write_dataset

# The `gate` fixture's policy: user budget 5.0, notebook budget 2.0.
USER_LIMIT = 5.0
COST = 0.3
WINS = int(USER_LIMIT / COST + 1e-9)  # 16 queries of 0.3 fit in 5.0; a 17th would not
SQL = "SELECT COUNT(*) FROM t"


def _spend_until_refused(address: str, notebook: str) -> int:
    """Fresh queries until the gate says the budget is gone; how many were answered."""
    client = Gate(address)
    answered = 0
    while True:
        try:
            client.query(SQL, epsilon=COST, notebook=notebook, fresh=True)
        except BudgetExhausted:
            return answered
        answered += 1


def _check_no_overspend(gate: GateProcess, answered: int) -> None:
    budget = Gate(gate.address).budget()
    spent = budget["user"]["spent"]["epsilon"]
    assert answered == WINS, answered
    assert spent == pytest.approx(WINS * COST)
    assert spent <= USER_LIMIT  # overspend = 0


@pytest.fixture(params=["gate", "workers_gate"], ids=["one process", "two workers"])
def racing_gate(request: pytest.FixtureRequest) -> GateProcess:
    """The gate as one process, and as two worker processes on one ledger
    (``service/workers.py``): the races below run against both."""
    return request.getfixturevalue(request.param)


def _race_threads(addresses: list[str], clients: int) -> int:
    """``clients`` threads, a notebook each (the user's budget, shared by all of them,
    is what they race for), spread over ``addresses``; how many were answered."""
    with ThreadPoolExecutor(clients) as pool:
        wins = pool.map(
            lambda i: _spend_until_refused(addresses[i % len(addresses)], f"nb{i}"),
            range(clients),
        )
        return sum(wins)


@pytest.mark.parametrize("clients", [12])
def test_racing_threads_never_overspend(racing_gate, clients):
    answered = _race_threads([racing_gate.address], clients)
    print(f"\n{clients} racing threads: {answered} answered, limit allows {WINS}")
    _check_no_overspend(racing_gate, answered)


def test_racing_processes_never_overspend(racing_gate):
    clients = 8
    context = multiprocessing.get_context("fork")
    with context.Pool(clients) as pool:
        wins = pool.starmap(
            _spend_until_refused, [(racing_gate.address, f"nb{i}") for i in range(clients)]
        )
    print(f"\n{clients} racing processes: {sum(wins)} answered, limit allows {WINS}")
    _check_no_overspend(racing_gate, sum(wins))


def test_workers_with_a_ledger_each_would_overspend_and_are_caught(tmp_path, short_dir):
    """The broken version of a gate of workers: each process with its own copy of the
    ledger (two gates, a state directory each, the clients spread over both). Each
    keeps its own budget, so together they answer twice what the budget allows, and
    the check the races above pass fails on it."""
    copies = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        copies.append(GateProcess(write_dataset(tmp_path / name), f"unix:{short_dir / name}.sock"))
    try:
        for copy in copies:
            copy.start()
        answered = _race_threads([copy.address for copy in copies], 12)
        assert answered == 2 * WINS
        with pytest.raises(AssertionError):
            _check_no_overspend(copies[0], answered)
    finally:
        for copy in copies:
            copy.stop()


# -- a gate killed between the debit and the reply --------------------------------

SLOW_POLICY = """
[gate]
state_dir = "state"
response_quantum_ms = 4000

[datasets.d]
database = "slow.duckdb"
privacy_unit = "pid"
user_budget = { epsilon = 5.0 }
notebook_budget = { epsilon = 5.0 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
s = { type = "str" }
"""
SLOW_SQL = "SELECT COUNT(*) FROM t WHERE s LIKE '%a%b%a%b%z%'"


@pytest.fixture
def slow_gate(tmp_path: Path, short_dir: Path):
    con = duckdb.connect(str(tmp_path / "slow.duckdb"))
    con.execute("CREATE TABLE t AS SELECT range AS pid, repeat('ab', 40) AS s FROM range(1000000)")
    con.close()
    (tmp_path / "policy.toml").write_text(SLOW_POLICY)
    process = GateProcess(tmp_path / "policy.toml", f"unix:{short_dir / 'slow.sock'}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _entries(ledger: Path) -> list[tuple[str, float]]:
    con = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        return con.execute("SELECT status, epsilon FROM entries ORDER BY id").fetchall()
    finally:
        con.close()


def test_kill_9_between_debit_and_reply_keeps_the_debit(slow_gate):
    ledger = slow_gate.state_dir / "ledger.sqlite3"
    outcome: dict[str, object] = {}

    def ask() -> None:
        try:
            outcome["reply"] = Gate(slow_gate.address).query(SLOW_SQL, epsilon=0.5)
        except Exception as exc:  # the gate dies under it
            outcome["error"] = exc

    asking = threading.Thread(target=ask)
    asking.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _entries(ledger):
        time.sleep(0.005)
    assert slow_gate.proc is not None
    os.kill(slow_gate.proc.pid, signal.SIGKILL)  # before the reply: it is held to 4 s
    asking.join(timeout=30)
    assert "reply" not in outcome, "the reply left before the kill"
    slow_gate.proc.wait()

    (status, epsilon), *_ = _entries(ledger)
    assert status in ("charged", "released") and epsilon == 0.5
    with sqlite3.connect(ledger) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    slow_gate.start()  # the same state directory, after a crash
    budget = Gate(slow_gate.address).budget()
    assert budget["user"]["spent"]["epsilon"] == pytest.approx(0.5)


def test_ledger_and_audit_log_survive_restarts(gate):
    client = Gate(gate.address)
    first = client.query(SQL, epsilon=0.2, notebook="nb")
    client.query("SELECT AVG(age) FROM t", epsilon=0.3, notebook="nb")
    gate.restart()
    client = Gate(gate.address)
    assert client.budget(notebook="nb")["notebook"]["spent"]["epsilon"] == pytest.approx(0.5)
    again = client.query(SQL, epsilon=0.2, notebook="nb")
    assert again.replayed and again.rows == first.rows
    gate.stop()  # the admin view reads the ledger the gate left
    audit = subprocess.run(
        [sys.executable, "-m", "dpmagic", "audit", "--policy", str(gate.policy), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert audit.returncode == 0, audit.stderr
    rows = json.loads(audit.stdout)
    assert [r["sql"] for r in rows].count(SQL) == 2  # the release and its replay
    assert any(r["sql"] == "SELECT AVG(age) FROM t" for r in rows)
    gate.start()


# -- cost never depends on the data ----------------------------------------------
