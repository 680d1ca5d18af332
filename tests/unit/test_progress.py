"""Waiting for the gate: progress only for slow replies, errors passed through, abort."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from dpmagic.client.errors import DPError
from dpmagic.client.http_gate import Gate
from dpmagic.magics.progress import SHOW_AFTER_S, Progress, wait_for


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


def test_abort_wakes_a_request_blocked_on_a_silent_peer():
    """A peer that accepts and never answers: abort() ends the wait at once."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        gate = Gate(f"http://127.0.0.1:{server.getsockname()[1]}", "t" * 20, timeout=30)
        outcome: list[BaseException] = []

        def ask() -> None:
            try:
                gate.query("SELECT 1")
            except DPError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=ask)
        worker.start()
        peer, _ = server.accept()
        with peer:
            time.sleep(0.3)
            start = time.monotonic()
            gate.abort()
            worker.join(5)
            assert not worker.is_alive()
            assert time.monotonic() - start < 2
        assert "did not reply" in str(outcome[0])


def test_abort_before_sending_sends_nothing():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        gate = Gate(f"http://127.0.0.1:{server.getsockname()[1]}", "t" * 20, timeout=5)
        connect = gate._connection

        def connection_aborted_while_connecting():
            conn = connect()
            real_connect = conn.connect

            def slow_connect() -> None:
                gate.abort()  # the interrupt lands while the socket is connecting
                real_connect()

            conn.connect = slow_connect
            return conn

        gate._connection = connection_aborted_while_connecting
        with pytest.raises(DPError, match="stopped before the request was sent"):
            gate.query("SELECT 1")
        peer, _ = server.accept()
        with peer:
            peer.settimeout(1)
            assert peer.recv(100) == b""  # not a byte of the request
