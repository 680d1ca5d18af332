"""Helpers for tests that drive an engine's store directly (``engines/interface.Store``):
shared by the engine contract (tests/system/test_engine_contract.py) and Spark's own
tests (tests/system/test_spark.py)."""

from __future__ import annotations

import time

from dpmagic.gate.engines.interface import OutOfResources, Store


def answers_after(store: Store, sql: str, within_s: float = 60.0) -> list[tuple]:
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
