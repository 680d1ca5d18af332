"""Timing channels, measured on real gate processes over their unix sockets.

D and D' differ by one unit, the target, whose 5,000 rows of 1,200 two-byte
characters (the most the policy lets one unit keep) make ``LOWER`` run about 70 ms
longer over D than over D' (each row priced under the row cap, ``max_row_work``:
one row can no longer be slow on its own, so the target brings many).
Replies are held to the next multiple of ``response_quantum_ms`` after the
request arrived, so the reply times of the two must be indistinguishable:
the statistic is a two-sample Kolmogorov-Smirnov test on reply times (D vs
D', interleaved), which must not reject at α = 1e-3 (a false alarm has
probability at most 1e-3), and every reply must land in the same quantum.
The same test rejects when padding is off, so it can see the difference it
rules out.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from scipy.stats import ks_2samp

from dpmagic.client.errors import DPError
from dpmagic.client.http_gate import Gate
from tests.conftest import GateProcess

ALPHA = 1e-3
QUANTUM_MS = 1500
REPEATS = 15
TARGET_ROWS = 5000
TARGET_CHARS = 1200
# Folding 2-byte characters is the dearest text work per character (docs/security.md,
# "Operator prices"): priced under every row cap here, slow over many rows.
SQL = "SELECT COUNT(*) FROM t WHERE LOWER(s) = 'x'"
# Four times the folding (about 400 ms on a 2-core machine, against 70 ms for SQL):
# well past the timeout below however idle the machine, so the timeout always fires.
SLOW_SQL = "SELECT COUNT(*) FROM t WHERE " + " OR ".join(
    f"{f}(s) = '{v}'" for f, v in (("LOWER", "x"), ("UPPER", "y"), ("LOWER", "z"), ("UPPER", "w"))
)

POLICY = """
[gate]
state_dir = "state-{name}-{quantum}-{timeout}"
response_quantum_ms = {quantum}
query_timeout_s = {timeout}

[datasets.d]
database = "{name}.duckdb"
privacy_unit = "pid"
# The target's heavy rows are kept at load, so they reach the query.
max_rows_per_partition = 5000
# And the work they bring is allowed (SLOW_SQL's bound is 37.5M steps): the tests
# below are of the padding and the time limit, past what the work bound refuses.
max_unit_work = 1000000000
user_budget = {{ epsilon = 1000.0 }}
notebook_budget = {{ epsilon = 1000.0 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
s = {{ type = "str", max_length = 1200 }}
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("timing")
    for name, target in (("with", True), ("without", False)):
        con = duckdb.connect(str(folder / f"{name}.duckdb"))
        con.execute("CREATE TABLE t AS SELECT range AS pid, 'ab' AS s FROM range(2000)")
        if target:  # one unit, the target, with as much text as the policy keeps
            con.execute(
                f"INSERT INTO t SELECT 999999, repeat('é', {TARGET_CHARS}) "
                f"FROM range({TARGET_ROWS})"
            )
        con.close()
    return folder


def _gates(folder: Path, short_dir: Path, quantum: int, timeout: float = 30.0):
    gates = {}
    for name in ("with", "without"):
        policy = folder / f"{name}-{quantum}-{timeout}.toml"
        text = POLICY.format(name=name, quantum=quantum, timeout=timeout)
        policy.write_text(text)
        gates[name] = GateProcess(policy, f"unix:{short_dir / (name + '.sock')}")
    return gates


@pytest.fixture
def gates(data, short_dir, request) -> Iterator[dict[str, GateProcess]]:
    quantum, timeout = request.param
    running = _gates(data, short_dir, quantum, timeout)
    try:
        for g in running.values():
            g.start()
        yield running
    finally:
        for g in running.values():
            g.stop()


def _reply_times(gates: dict[str, GateProcess]) -> dict[str, list[float]]:
    """Seconds from request to reply, D and D' interleaved so load drifts hit both."""
    times: dict[str, list[float]] = {"with": [], "without": []}
    clients = {name: Gate(g.address) for name, g in gates.items()}
    for _ in range(REPEATS):
        for name, client in clients.items():
            start = time.perf_counter()
            with contextlib.suppress(DPError):
                client.query(SQL, epsilon=0.1, fresh=True)
            times[name].append(time.perf_counter() - start)
    return times


def _summary(times: dict[str, list[float]]) -> str:
    return ", ".join(
        f"{name}: median {statistics.median(t) * 1000:.0f} ms, "
        f"range {min(t) * 1000:.0f}–{max(t) * 1000:.0f} ms"
        for name, t in times.items()
    )


@pytest.mark.parametrize("gates", [(QUANTUM_MS, 30.0)], indirect=True)
def test_padding_hides_a_target_that_slows_the_query(gates):
    times = _reply_times(gates)
    test = ks_2samp(times["with"], times["without"])
    print(f"\npadded to {QUANTUM_MS} ms: {_summary(times)}; KS p = {test.pvalue:.3g}")
    quantum = QUANTUM_MS / 1000
    for t in times["with"] + times["without"]:
        assert quantum <= t < 2 * quantum, t  # the same quantum, whether or not the target is in
    assert test.pvalue > ALPHA, _summary(times)


@pytest.mark.parametrize("gates", [(0, 30.0)], indirect=True)
def test_without_padding_the_same_test_sees_the_target(gates):
    times = _reply_times(gates)
    test = ks_2samp(times["with"], times["without"])
    print(f"\nunpadded: {_summary(times)}; KS p = {test.pvalue:.3g}")
    assert test.pvalue < ALPHA, _summary(times)


@pytest.mark.parametrize("gates", [(QUANTUM_MS, 0.02)], indirect=True)
def test_a_timeout_interrupts_duckdb_answers_generically_and_stays_charged(gates):
    client = Gate(gates["with"].address)
    start = time.perf_counter()
    with pytest.raises(DPError, match="time or memory and was stopped") as failed:
        client.query(SLOW_SQL, epsilon=0.1)
    elapsed = time.perf_counter() - start
    assert "999999" not in str(failed.value)
    assert QUANTUM_MS / 1000 <= elapsed < 2 * QUANTUM_MS / 1000  # interrupted, then padded
    assert client.budget()["user"]["spent"]["epsilon"] == pytest.approx(0.1)
