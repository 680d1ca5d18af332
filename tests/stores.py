"""Helpers for tests that drive an engine's store directly (``engines/interface.Store``):
shared by the engine contract (tests/system/test_engine_contract.py) and Spark's own
tests (tests/system/test_spark.py)."""

from __future__ import annotations

import time

from dpmagic.gate.engines.interface import OutOfResources, Store


def heavy(column: str) -> str:
    """A count over four scans of ``visits`` (one kept to the rows whose ``column`` is
    0): 4.1 billion joined rows of 600, past a one-second limit on either engine
    (DuckDB 2 s, Spark 14 s, measured), yet one that ends on its own. Spark's cancel
    does not stop a cartesian product's tasks, which run to their end, holding the
    cores: four full scans (1.3·10^11 rows) held them for the rest of the suite."""
    return (
        "SELECT COUNT(*) FROM visits a, visits b, visits c, visits d "
        f"WHERE d.{column} = 0 AND a.{column} + b.{column} + c.{column} + d.{column} >= 0"
    )


def answers_after(store: Store, sql: str, within_s: float = 120.0) -> list[tuple]:
    """``sql``'s rows once the store answers again after a stopped query. Spark stops a
    cancelled job's tasks when they next check for it, so for a moment its cores may
    still be busy and a cheap query can run out of its (short) time too; it must
    answer within ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return store.run(sql).rows
        except OutOfResources:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
