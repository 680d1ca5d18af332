"""No user can make another's queries fail or pay for another's load, on a real gate.

Over TCP with two users' tokens, padding off: bob's cheap queries are timed on an
idle gate, then while alice keeps four of the heaviest queries this policy lets
her send in flight (a join whose rows multiply by a public table's, each one
refused no work bound but taking a good fraction of a second), and a third time
once she stopped. Every one of bob's queries must be answered, none of his
entries in the ledger may be a failure, and his median under load must stay within
3× of idle (``admission.py``: one running query per user and dataset; the unit
tests in ``tests/unit/test_admission.py`` show the rule and the retry of a failure
under load each catching their broken version). The median, not the p99: bob's
p99 moves with whatever else the machine runs (36 ms against 11 ms idle once,
beside two other test runs), his median does not.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from dpmagic.client import Gate
from dpmagic.gate.failures import GateError
from tests.conftest import GateProcess, free_port

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
ROWS = 60_000
CODES = 1_500
POLICY = """
[gate]
state_dir = "state"
response_quantum_ms = 0
tokens_file = "tokens.toml"
threads = 2

[datasets.d]
sources = {{ t = "t.csv", codes = "codes.csv" }}
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 2
user_budget = {{ epsilon = 1e6 }}
notebook_budget = {{ epsilon = 1e6 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
v = {{ type = "int", lower = 0, upper = {codes} }}

[datasets.d.tables.codes]
public = true
[datasets.d.tables.codes.columns]
code = {{ type = "int", lower = 0, upper = {codes} }}
"""
HEAVY = "SELECT COUNT(*) FROM t JOIN codes c ON c.code < t.v"
CHEAP = "SELECT COUNT(*) FROM t WHERE v > 10"


def _write(folder: Path) -> Path:
    (folder / "t.csv").write_text(
        "pid,v\n" + "".join(f"{i // 2},{(i * 7919) % CODES}\n" for i in range(ROWS))
    )
    (folder / "codes.csv").write_text("code\n" + "".join(f"{c}\n" for c in range(CODES)))
    (folder / "tokens.toml").write_text(
        "[users]\n" + "".join(f'{u} = "{t}"\n' for u, t in TOKENS.items())
    )
    (folder / "tokens.toml").chmod(0o600)
    policy = folder / "policy.toml"
    policy.write_text(POLICY.format(codes=CODES))
    return policy


def _times(gate: Gate, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        gate.query(CHEAP, epsilon=1e-6 * (1 + i), fresh=True)  # each one a fresh run
        out.append(time.perf_counter() - start)
    return out


def _p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98]


def _summary(times: list[float]) -> tuple[float, float]:
    return statistics.median(times), _p99(times)


def _measure(folder: Path) -> tuple[tuple, tuple, int, list[str]]:
    """bob's median and p99 idle and under alice's load, alice's answered heavy
    queries, and the statuses of bob's ledger entries."""
    process = GateProcess(_write(folder), f"tcp:127.0.0.1:{free_port()}")
    process.start()
    try:
        bob = Gate(process.address, TOKENS["bob"], timeout=120)
        alice = Gate(process.address, TOKENS["alice"], timeout=120)
        start = time.perf_counter()
        alice.query(HEAVY, epsilon=1e-9, fresh=True)
        heavy_s = time.perf_counter() - start
        assert heavy_s > 0.05, f"the heavy query took {heavy_s:.3f} s: not heavy"
        _times(bob, 10)  # warm
        idle = _times(bob, 60)
        stop, done = threading.Event(), [0]

        def load() -> None:
            while not stop.is_set():
                try:
                    alice.query(HEAVY, epsilon=1e-9, fresh=True)
                    done[0] += 1
                except GateError:
                    pass

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        try:
            loaded = _times(bob, 60)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        history = bob.history(dataset="d", notebook="unnamed", limit=1000)
        statuses = [e["status"] for e in history["entries"]]
        return _summary(idle), _summary(loaded), done[0], statuses
    finally:
        process.stop()


def test_one_users_heaviest_queries_neither_fail_nor_slow_anothers(tmp_path: Path) -> None:
    idle, loaded, heavy, statuses = _measure(tmp_path)
    print(
        f"bob median / p99 idle {idle[0] * 1000:.1f} / {idle[1] * 1000:.1f} ms, under load "
        f"{loaded[0] * 1000:.1f} / {loaded[1] * 1000:.1f} ms; {heavy} heavy"
    )
    assert heavy >= 4
    assert statuses and all(s == "released" for s in statuses), statuses
    assert loaded[0] <= 3 * idle[0]
