"""Python's cyclic garbage collector around large replies: the gate collects its
youngest generation every ``GC_YOUNG`` allocations and never walks what it built at
start (``server.tune_collector``); the client decodes a reply with the collector
paused (``client.collector_paused``). Both are measured by counting the collections a
100,000-cell reply's worth of lists sets off, against CPython's defaults."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator

import pytest

from dpmagic.client.http_gate import _decode, collector_paused
from dpmagic.gate.service.process import GC_YOUNG, tune_collector

CELLS = 100_000


@pytest.fixture
def collections() -> Iterator[Callable[[], int]]:
    """The number of collections started since the fixture began; CPython's
    collector settings are restored afterwards."""
    started = [0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] += 1

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.callbacks.append(count)
    try:
        yield lambda: started[0]
    finally:
        gc.callbacks.remove(count)
        gc.unfreeze()
        gc.set_threshold(*threshold)
        if enabled:
            gc.enable()
        gc.collect()  # what the tests left behind, collected now rather than mid-test later


def _build_reply() -> list[list[object]]:
    return [[i, float(i), [i - 0.5, i + 0.5]] for i in range(CELLS)]


def test_the_gate_collects_a_large_replys_lists_far_less_often(collections) -> None:
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    before = collections()
    _build_reply()
    default = collections() - before
    tune_collector()
    assert gc.get_threshold()[0] == GC_YOUNG
    assert gc.get_freeze_count() > 0  # what the gate built at start is never walked
    before = collections()
    _build_reply()
    tuned = collections() - before
    assert default > 100 and tuned <= 2 * (2 * CELLS // GC_YOUNG + 1), (default, tuned)


def test_the_client_decodes_a_reply_without_collecting(collections) -> None:
    reply = json.dumps({"rows": [[i, i * 0.5, None] for i in range(CELLS)]}).encode()
    gc.enable()
    before = collections()
    json.loads(reply)
    assert collections() - before > 50  # what the pause avoids
    before = collections()
    assert len(_decode(200, reply)["rows"]) == CELLS
    # At most the one collection that catches up once the collector is back on.
    assert collections() - before <= 1
    assert gc.isenabled()


def test_a_paused_collector_is_turned_back_on_only_if_it_was_on(collections) -> None:
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("a failed decode")
    assert gc.isenabled()
