"""Waiting for the gate: progress only for slow replies, errors passed through."""

from __future__ import annotations

import time

import pytest

from dpmagic.progress import SHOW_AFTER_S, Progress, wait_for


def test_fast_replies_show_nothing():
    shown: list[Progress] = []
    assert wait_for(lambda: 42, shown.append, lambda: None) == 42
    assert shown == []


def test_slow_replies_show_elapsed_seconds_then_done():
    shown: list[Progress] = []
    wait = SHOW_AFTER_S + 1.2
    assert wait_for(lambda: time.sleep(wait) or "ok", shown.append, lambda: None) == "ok"
    assert [int(p.waited) for p in shown[:-1]] == [1, 2]
    assert not any(p.done for p in shown[:-1])
    assert shown[-1].done and shown[-1].waited >= wait
    assert repr(shown[0]).startswith("waiting for the gate… 1 s (Kernel ▸ Interrupt")
    assert "dpmagic-progress" in shown[0]._repr_html_()
    assert repr(shown[-1]) == f"the gate answered after {shown[-1].waited:.0f} s"


def test_errors_of_the_request_reach_the_caller():
    def fail() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        wait_for(fail, lambda p: None, lambda: None)
