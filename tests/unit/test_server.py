"""The gate as a real subprocess: HTTP over a real unix socket and over TCP
with tokens, identity, error replies, padding, and a clean SIGTERM."""

# ruff: noqa: F811 - the shared_gate fixture is tests/server_gate.py's

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from tests.server_gate import (  # noqa: F401 - shared_gate is a fixture
    ALICE_TOKEN,
    BOB_TOKEN,
    COUNT,
    POLICY,
    START_TIMEOUT_S,
    Gate,
    UnixHTTPConnection,
    call,
    connection,
    shared_gate,
    write_policy,
)


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 411), ({"Content-Length": str(1024 * 1024 + 1)}, 413), ({"Content-Length": "x"}, 400)],
)
def test_a_body_needs_a_modest_content_length(
    shared_gate: Gate, headers: dict[str, str], status: int
) -> None:
    """Refused from the headers alone: an oversized body is never read."""
    conn = connection(shared_gate.address)
    try:
        conn.putrequest("POST", "/v1/query")
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == status
        assert json.loads(response.read())["error"]["kind"] == "bad_request"
    finally:
        conn.close()


@pytest.mark.system  # a real gate timed to the tenth of a second: with the system tests
def test_the_padding_clock_runs_from_the_accept(tmp_path: Path):
    """A client that connects, waits 0.3 s and only then sends its query is answered one
    quantum (1 s) after it connected: how soon the request was read is inside the pad.
    A clock started at the headers, as the gate's first was, answers at 1.3 s. The
    gate answers the same query once before, so the measured one is not its first
    (whose imports and analysis, on a loaded machine, once took past the quantum)."""
    with tempfile.TemporaryDirectory(prefix="dpm-") as short:
        gate = Gate(write_policy(tmp_path, "response_quantum_ms = 1000"), f"unix:{short}/g.sock")
        try:
            warm = connection(gate.address)
            warm.request("POST", "/v1/query", body=json.dumps(COUNT))
            warm.getresponse().read()
            warm.close()
            conn = connection(gate.address)
            conn.connect()
            start = time.monotonic()
            time.sleep(0.3)
            conn.request("POST", "/v1/query", body=json.dumps({**COUNT, "fresh": True}))
            response = conn.getresponse()
            response.read()
            elapsed = time.monotonic() - start
        finally:
            gate.stop()
    assert response.status == 200
    assert 0.95 <= elapsed < 1.28, elapsed
