"""The client against a real gate process: answers, replay, refusals, budget, outages."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from dpmagic.client.errors import DPError, GateUnavailable
from dpmagic.client.http_gate import Gate
from tests.conftest import free_port

COUNT_BY_SEX = "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex ORDER BY sex"


def test_missing_socket_is_gate_unavailable(short_dir: Path):
    address = f"unix:{short_dir / 'nobody.sock'}"
    client = Gate(address)
    assert client.health() is False
    with pytest.raises(GateUnavailable) as down:
        client.query(COUNT_BY_SEX)
    assert address in down.value.message
    assert "DPMAGIC_GATE" in down.value.message


def test_refused_tcp_connection_is_gate_unavailable():
    port = free_port()
    with pytest.raises(GateUnavailable, match=f"127.0.0.1:{port}"):
        Gate(f"http://127.0.0.1:{port}").budget()


def test_no_address_says_how_to_set_one(monkeypatch):
    monkeypatch.delenv("DPMAGIC_GATE", raising=False)
    with pytest.raises(GateUnavailable, match="DPMAGIC_GATE"):
        Gate()


@pytest.mark.parametrize("address", ["ftp://host:1", "http://host", "unix:", "gate.sock"])
def test_malformed_addresses_are_refused(address):
    with pytest.raises(GateUnavailable, match="address"):
        Gate(address)


def test_a_lost_reply_is_reported_once_and_never_retried(short_dir: Path):
    """A gate that takes the request and dies must not see it twice: it may have charged."""
    path = short_dir / "mute.sock"
    requests: list[bytes] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    listener.settimeout(1)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                requests.append(conn.recv(65536))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(DPError, match="did not reply") as lost:
            Gate(f"unix:{path}").query(COUNT_BY_SEX, epsilon=0.5)
        assert not isinstance(lost.value, GateUnavailable)
    finally:
        listener.close()
        thread.join(timeout=5)
    assert len(requests) == 1
    assert requests[0].startswith(b"POST /v1/query ")
