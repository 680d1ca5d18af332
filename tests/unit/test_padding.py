"""Which requests read the private data, as the engine marks them (``PrivateRead``), on a
real engine over a real ledger and DuckDB: only a run marks, before it reads, so a
failure after it began is marked too; a replay, a dry run and every refusal before
the run are not. The server pads exactly the marked replies (``padding.py``;
the timing itself is measured on real gate processes in tests/system/test_padding.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import duckdb
import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import BadRequest, Failed, GateError, OverBudget, Refused
from dpmagic.gate.padding import PrivateRead, release_time
from tests.gate_helpers import running_engine, slow_runs

POLICY = """
[gate]
state_dir = "state"
query_timeout_s = {timeout}

[datasets.d]
database = "people.duckdb"
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = 3.0 }}
notebook_budget = {{ epsilon = 3.0 }}
query_default = {{ epsilon = 0.5 }}
max_resource_failures = 1

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""
COUNT = "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex"


def _engine(folder: Path, rows: int, timeout: float = 30.0):
    folder.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(folder / "people.duckdb"))
    con.execute(
        "CREATE TABLE t AS SELECT range // 2 AS pid, (range * 37) % 90 AS age, "
        f"range % 2 AS sex FROM range({rows})"
    )
    con.close()
    return running_engine(folder, textwrap.dedent(POLICY.format(timeout=timeout)))


def _marked(engine: Engine, body: dict[str, object]) -> tuple[bool, object]:
    """Whether answering ``body`` read the private data, and the reply or the error."""
    reads = PrivateRead()
    try:
        outcome: object = engine.query("alice", {"notebook": "nb", **body}, reads)
    except GateError as exc:
        outcome = exc
    return reads.began, outcome


@pytest.fixture
def engine(tmp_path):
    with _engine(tmp_path, 300) as e:
        yield e


def test_a_fresh_run_is_marked_and_its_replay_is_not(engine):
    marked, first = _marked(engine, {"sql": COUNT})
    assert marked and isinstance(first, dict) and first["replayed"] is False
    marked, again = _marked(engine, {"sql": COUNT})
    assert not marked
    assert isinstance(again, dict) and again["replayed"] is True
    assert again["rows"] == first["rows"]  # the stored reply, not a new run
    marked, fresh = _marked(engine, {"sql": COUNT, "fresh": True})
    assert marked and isinstance(fresh, dict) and fresh["replayed"] is False


def test_a_dry_run_is_not_marked(engine):
    marked, reply = _marked(engine, {"sql": COUNT, "dry_run": True})
    assert not marked
    assert isinstance(reply, dict) and reply["dry_run"] is True and reply["rows"] == []


def test_refusals_before_the_run_are_not_marked(engine):
    refused = [
        ({"sql": "SELECT age FROM t"}, Refused),  # the analysis
        ({"sql": "SELECT COUNT(*) FROM nowhere"}, Refused),  # a name
        ({"sql": COUNT, "epsilon": -1}, BadRequest),  # the body
        ({"sql": COUNT, "epsilon": 5.0}, OverBudget),  # the debit
    ]
    for body, kind in refused:
        marked, error = _marked(engine, body)
        assert isinstance(error, kind), (body, error)
        assert not marked, body


def test_a_failure_after_the_run_began_is_marked_and_a_refusal_for_failures_is_not(
    tmp_path, monkeypatch
):
    """A run of a second (``slow_runs``) against a time limit of a millisecond: the
    run begins and is stopped. The next query is refused before the debit
    (max_resource_failures = 1)."""
    slow_runs(monkeypatch, 1.0)
    with _engine(tmp_path, 300, timeout=0.001) as engine:
        marked, error = _marked(engine, {"sql": "SELECT sex, SUM(age) FROM t GROUP BY sex"})
        assert isinstance(error, Failed) and "charged" in error.message
        assert marked
        marked, error = _marked(engine, {"sql": COUNT})
        assert isinstance(error, Refused) and "max_resource_failures" in error.message
        assert not marked


def test_a_clipped_query_is_marked_by_its_first_release(engine):
    body = {"sql": "SELECT SUM(age) FROM t", "epsilon": 1.0, "clip": 0.2}
    marked, reply = _marked(engine, body)
    assert marked and isinstance(reply, dict)
    marked, reply = _marked(engine, body)  # both releases replayed
    assert not marked
    assert isinstance(reply, dict) and reply["replayed"] and reply["clip"]["replayed"]


def test_the_engine_works_without_a_recorder(engine):
    """Callers outside the server (benchmarks, the audit) pass none."""
    assert engine.query("alice", {"sql": COUNT, "notebook": "nb"})["replayed"] is False


@pytest.mark.parametrize(
    ("now", "released"),
    [
        (10.0, 10.25),  # at once: still a whole quantum
        (10.1, 10.25),
        (10.25, 10.25),  # exactly on the boundary: not a quantum more
        (10.26, 10.5),  # past it: the next one
        (11.9, 12.0),
    ],
)
def test_a_padded_reply_leaves_at_the_first_quantum_not_before_now(now, released):
    assert release_time(10.0, now, 0.25) == pytest.approx(released)
