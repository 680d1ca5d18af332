"""A Spark run past its deadline replies at its deadline, and keeps its place until its
tasks have truly ended (``engines/deadline.py``, ``SparkDatabase._until_tasks_end``).

Spark matches a ``LIKE`` with several ``%`` by a Java regular expression, which
backtracks and never looks for an interrupt: cancelling the run's job fails it on
the driver at once, while its task keeps a core busy for seconds. The store must
raise ``OutOfResources`` at the deadline all the same, and the run's work (which
holds its user's place) must end only with the task; the broken version, which
let the place go as the driver gave up, is caught. Raw SQL through the store: the
analysis refuses such patterns on Spark before the debit, this tests the engine
when something slow gets through."""

from __future__ import annotations

import time
from concurrent.futures import wait
from pathlib import Path

import duckdb
import pytest

from dpmagic.gate.engines import sharing
from dpmagic.gate.engines.interface import OutOfResources
from dpmagic.gate.engines.sharing import Sharing
from dpmagic.gate.policy import parse_policy

pytestmark = pytest.mark.spark

TIMEOUT_S = 2.0
# About 8 s of one core on the row of unit 7, whatever the cancelling.
BACKTRACKS = (
    "SELECT COUNT(*) FROM t WHERE pid = 7 AND "
    "concat(repeat('abcd', 100), CAST(pid AS STRING)) LIKE '%a%b%c%d%z%'"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from dpmagic.gate.engines.spark.database import SparkDatabase

    folder: Path = tmp_path_factory.mktemp("spark-deadline")
    path = folder / "t.parquet"
    duckdb.sql(f"COPY (SELECT range AS pid FROM range(100)) TO '{path}' (FORMAT parquet)")
    raw = {
        "gate": {"state_dir": str(folder / "state"), "query_timeout_s": TIMEOUT_S},
        "datasets": {
            "d": {
                "sources": {"t": str(path)},
                "privacy_unit": "pid",
                "user_budget": {"epsilon": 1.0},
                "engine": "spark",
                "spark": {"master": "local[2]"},
                "tables": {"t": {"columns": {"pid": {"type": "int"}}}},
            }
        },
    }
    policy = parse_policy(raw, folder / "policy.toml")
    store = SparkDatabase(policy.dataset("d"), policy.gate)
    store._vetted.add(BACKTRACKS)  # past the guard, which lets no ``repeat`` through
    # Warm: in a fresh JVM, planning and compiling took most of the limit, and the
    # cancel landed before the task reached the regular expression.
    warm = BACKTRACKS.replace("150", "2").replace("100", "2")
    store._vetted.add(warm)
    assert store.run(warm).rows == [(0,)]
    yield store
    store.close()


def _run(store) -> tuple[float, float]:
    """Seconds from the deadline to the raise, and to the run's work ending."""
    engine = Sharing()
    share = engine.join()
    with sharing.counted_on(share), pytest.raises(OutOfResources) as caught:
        store.run(BACKTRACKS)
    raised = time.monotonic()
    wait(share.lingering, timeout=120)
    engine.leave(share)
    return raised - caught.value.release_at, time.monotonic() - caught.value.release_at


def test_a_run_whose_task_ignores_the_cancel_keeps_its_place_until_it_ends(store) -> None:
    raised, ended = _run(store)
    print(f"\nraised {raised:+.3f} s after the deadline, its task ended {ended:+.3f} s")
    assert raised < 0.1
    assert ended > 2.0  # the task went on, and the run's place with it
    assert store.run("SELECT COUNT(*) FROM t").rows == [(100,)]


def test_the_broken_version_lets_the_place_go_with_the_driver(store, monkeypatch) -> None:
    monkeypatch.setattr(type(store), "_until_tasks_end", lambda self, tag: None)
    raised, ended = _run(store)
    assert raised < 0.1 and ended < 1.0  # while the task still runs
    monkeypatch.undo()
    time.sleep(10)  # let the task end before the next test's Spark work
