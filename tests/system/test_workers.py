"""A gate of two worker processes (``gate.workers = 2``, ``service/workers.py``): both
answer, over one ledger; a user's run holds the lock every worker waits on; a worker
that dies is replaced; the workers stop with their supervisor, however it stops; a
gate whose workers cannot start says so once and leaves none behind.

The budget races run against this gate too (tests/system/test_budget_integrity.py,
``racing_gate``), beside the broken version they catch: a ledger per worker."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pytest

from dpmagic.client.http_gate import Gate
from dpmagic.gate.engines.run_locks import RunLocks
from tests.conftest import PEOPLE, TOKENS, GateProcess, free_port, write_dataset
from tests.system import test_budget_integrity as integrity

WAIT_S = 30.0


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def _replaced(supervisor: int, gone: int) -> bool:
    """Whether ``supervisor`` has two workers again, ``gone`` not among them: read once,
    so that a worker still dying is not counted in one reading and missed in another."""
    workers = _children(supervisor)
    return len(workers) == 2 and gone not in workers


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def _supervisor(gate: GateProcess) -> int:
    assert gate.proc is not None
    return gate.proc.pid


def _stop_and_read_log(gate: GateProcess) -> str:
    """SIGTERM the gate, wait for it, and return everything its processes logged."""
    proc = gate.proc
    assert proc is not None and proc.stderr is not None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    log = proc.stderr.read()
    gate.stop()
    return log


def test_two_workers_answer_over_one_ledger(workers_gate: GateProcess) -> None:
    workers = _children(_supervisor(workers_gate))
    assert len(workers) == 2
    sql = "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex"
    threads, each, epsilon = 8, 4, 0.125  # 4.0 of the user's 5.0; 0.5 a notebook

    def ask(i: int) -> list[list[object]]:
        client = Gate(workers_gate.address)
        rows = []
        for _ in range(each):
            reply = client.query(sql, epsilon=epsilon, notebook=f"nb{i}", fresh=True)
            assert reply.columns == ["sex", "n"]
            rows += reply.rows
        return rows

    with ThreadPoolExecutor(threads) as pool:
        rows = [row for answer in pool.map(ask, range(threads)) for row in answer]
    assert sorted({sex for sex, _ in rows}) == [0, 1]
    counts = [float(n) for _, n in rows]
    # Each cell is PEOPLE / 2 with Laplace noise of scale 8 (std 11.3); the mean of 64
    # is within 10 of it unless something other than noise moved it.
    assert abs(sum(counts) / len(counts) - PEOPLE / 2) < 10
    spent = Gate(workers_gate.address).budget()["user"]["spent"]["epsilon"]
    assert spent == pytest.approx(threads * each * epsilon)
    log = _stop_and_read_log(workers_gate)
    answered = [line for line in log.splitlines() if "POST /v1/query 200" in line]
    assert len(answered) == threads * each
    for index in (0, 1):  # each worker took a share of them
        assert any(line.startswith(f"dpmagic gate worker {index}:") for line in answered)


SLOW_POLICY = """
[gate]
state_dir = "state"
response_quantum_ms = 0
tokens_file = "tokens.toml"
workers = 2

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
def slow_workers(tmp_path: Path) -> Iterator[GateProcess]:
    """Two workers on TCP (alice's and bob's tokens) over a table whose query runs long
    enough to be seen running."""
    con = duckdb.connect(str(tmp_path / "slow.duckdb"))
    con.execute("CREATE TABLE t AS SELECT range AS pid, repeat('ab', 40) AS s FROM range(3000000)")
    con.close()
    tokens = "[users]\n" + "".join(f'{user} = "{token}"\n' for user, token in TOKENS.items())
    (tmp_path / "tokens.toml").write_text(tokens)
    (tmp_path / "tokens.toml").chmod(0o600)
    (tmp_path / "policy.toml").write_text(SLOW_POLICY)
    process = GateProcess(tmp_path / "policy.toml", f"tcp:127.0.0.1:{free_port()}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _held(path: Path) -> bool:
    """Whether another process holds the ``flock`` on ``path`` now."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_users_run_holds_the_lock_every_worker_waits_on(slow_workers: GateProcess) -> None:
    """The lock ``engines/run_locks.py`` keeps is taken by the worker running alice's
    query, for as long as it runs, and let go after; bob's is another lock, free
    meanwhile (that the lock makes another process wait, and that one process's rule
    alone does not, is tests/unit/test_run_locks.py's). With one process's rule alone
    (``Admission()`` without the lock) the lock is never seen held."""
    locks = RunLocks(slow_workers.state_dir, "d")
    alice = Gate(slow_workers.address, token=TOKENS["alice"])
    replies: list[object] = []
    asking = threading.Thread(target=lambda: replies.append(alice.query(SLOW_SQL, epsilon=0.5)))
    seen = bob_free = False
    asking.start()
    while asking.is_alive() and not seen:
        seen = locks.path("alice").exists() and _held(locks.path("alice"))
        bob_free = not _held(locks.path("bob"))
    asking.join(timeout=WAIT_S)
    assert replies, "the query was not answered"
    assert seen, "no worker held alice's lock while her query ran"
    assert bob_free
    assert not _held(locks.path("alice"))


def test_a_worker_that_dies_is_replaced(workers_gate: GateProcess) -> None:
    supervisor = _supervisor(workers_gate)
    first = _children(supervisor)
    killed = min(first)
    os.kill(killed, signal.SIGKILL)
    _until(lambda: _replaced(supervisor, killed), "no worker took the killed one's place")
    client = Gate(workers_gate.address)
    for i in range(6):  # whichever worker accepts, each is answered, on the one ledger
        client.query("SELECT COUNT(*) FROM t", epsilon=0.25, notebook=f"nb{i}", fresh=True)
    assert client.budget()["user"]["spent"]["epsilon"] == pytest.approx(1.5)


def test_a_worker_that_crashes_leaves_its_threads_stacks_in_the_log(
    workers_gate: GateProcess,
) -> None:
    """A worker killed by SIGSEGV, as a crash in DuckDB, SQLite or Arrow would kill it:
    before it dies it writes where each of its threads was (``faulthandler``), and the
    supervisor names the signal; without them the log said ``exited (-11)`` and no
    more, and the crash could not be told from its caller's side."""
    supervisor = _supervisor(workers_gate)
    crashed = min(_children(supervisor))
    os.kill(crashed, signal.SIGSEGV)
    _until(lambda: _replaced(supervisor, crashed), "no worker took the crashed one's place")
    Gate(workers_gate.address).query("SELECT COUNT(*) FROM t", epsilon=0.25, fresh=True)
    log = _stop_and_read_log(workers_gate)
    assert "Fatal Python error: Segmentation fault" in log
    assert "Current thread 0x" in log  # every thread's stack, the crashed one's first
    assert re.search(r"dpmagic gate: worker [01] was killed by SIGSEGV; starting another", log)


def test_sigterm_stops_every_worker_and_removes_the_socket(workers_gate: GateProcess) -> None:
    workers = _children(_supervisor(workers_gate))
    socket_file = Path(workers_gate.address.removeprefix("unix:"))
    assert socket_file.exists()
    _stop_and_read_log(workers_gate)
    assert not any(_alive(pid) for pid in workers)
    assert not socket_file.exists()


def test_workers_stop_when_their_supervisor_is_killed(workers_gate: GateProcess) -> None:
    supervisor = _supervisor(workers_gate)
    workers = _children(supervisor)
    os.kill(supervisor, signal.SIGKILL)
    try:
        # Their standard input, the supervisor's pipe, reads its end: they stop on their own.
        _until(lambda: not any(_alive(p) for p in workers), "a worker outlived its supervisor")
    finally:
        for pid in workers:  # not left running if they did not
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_workers_that_cannot_start_say_so_once_and_leave_none(tmp_path: Path) -> None:
    policy = write_dataset(tmp_path, "workers = 2\n")
    (tmp_path / "t.csv").unlink()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpmagic.gate.service.server", "--policy", str(policy)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children: set[int] = set()
    while proc.poll() is None:
        children |= _children(proc.pid)
        time.sleep(0.01)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 2
    assert out == ""  # never announced
    errors = [line for line in err.splitlines() if line.startswith("dpmagic: error:")]
    assert len(errors) == 1 and "t.csv" in errors[0], err
    assert not any(_alive(pid) for pid in children)


def test_kill_9_of_the_workers_between_debit_and_reply_keeps_the_debit(
    tmp_path: Path, short_dir: Path
) -> None:
    """``test_budget_integrity``'s crash, in a gate of workers: the workers killed while
    a reply is held (4 s of padding) after its debit; the debit stays, nothing left,
    and the workers that take their place count it."""
    con = duckdb.connect(str(tmp_path / "slow.duckdb"))
    con.execute("CREATE TABLE t AS SELECT range AS pid, repeat('ab', 40) AS s FROM range(100000)")
    con.close()
    policy = tmp_path / "policy.toml"
    policy.write_text(
        integrity.SLOW_POLICY.replace("response_quantum_ms", "workers = 2\nresponse_quantum_ms")
    )
    gate = GateProcess(policy, f"unix:{short_dir / 'kill.sock'}")
    gate.start()
    try:
        ledger = gate.state_dir / "ledger.sqlite3"
        outcome: dict[str, object] = {}

        def ask() -> None:
            try:
                outcome["reply"] = Gate(gate.address).query(integrity.SLOW_SQL, epsilon=0.5)
            except Exception as exc:  # its worker dies under it
                outcome["error"] = exc

        asking = threading.Thread(target=ask)
        asking.start()
        _until(lambda: bool(integrity._entries(ledger)), "no debit was written")
        supervisor = _supervisor(gate)
        killed = _children(supervisor)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        asking.join(timeout=WAIT_S)
        assert "reply" not in outcome, "the reply left before the kill"
        (status, epsilon), *_ = integrity._entries(ledger)
        assert status in ("charged", "released") and epsilon == 0.5
        _until(lambda: len(_children(supervisor) - killed) == 2, "no workers took their place")
        assert Gate(gate.address).budget()["user"]["spent"]["epsilon"] == pytest.approx(0.5)
    finally:
        gate.stop()
