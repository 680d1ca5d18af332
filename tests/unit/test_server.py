"""The gate as a real subprocess: HTTP over a real unix socket and over TCP
with tokens, identity, error replies, padding, and a clean SIGTERM."""

from __future__ import annotations

import http.client
import json
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

POLICY = """\
[gate]
state_dir = "state"
{gate}

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = {{ epsilon = 3.0 }}
notebook_budget = {{ epsilon = 1.0 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""
ALICE_TOKEN = "alice-token-0123456789"
BOB_TOKEN = "bob-token-9876543210"
COUNT = {"sql": "SELECT COUNT(*) FROM t", "epsilon": 0.5}
START_TIMEOUT_S = 60.0


def write_policy(folder: Path, gate: str = "") -> Path:
    rows = [f"{pid},{(pid * 7) % 90},{pid % 2}" for pid in range(200)]
    (folder / "t.csv").write_text("pid,age,sex\n" + "\n".join(rows) + "\n")
    policy = folder / "policy.toml"
    if "response_quantum_ms" not in gate:  # padding is on by default; these tests time nothing
        gate += "\nresponse_quantum_ms = 0"
    policy.write_text(POLICY.format(gate=gate))
    return policy


class Gate:
    """``python -m dpmagic.gate.service.server`` as a child process."""

    def __init__(self, policy: Path, listen: str) -> None:
        command = [sys.executable, "-m", "dpmagic.gate.service.server"]
        self.proc = subprocess.Popen(
            [*command, "--policy", str(policy), "--listen", listen],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.line = self._first_line()

    def _first_line(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        return self.proc.stdout.readline() if ready else ""

    @property
    def address(self) -> str:
        assert self.line.startswith("dpmagic gate listening on "), self.stop()
        return self.line.removeprefix("dpmagic gate listening on ").strip()

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        """Signal the gate; its exit status and everything it wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def connection(address: str) -> http.client.HTTPConnection:
    if address.startswith("unix:"):
        return UnixHTTPConnection(address.removeprefix("unix:"))
    host, _, port = address.removeprefix("tcp:").rpartition(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


@pytest.fixture(scope="module")
def shared_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    """One gate for the error cases, which must all leave the budget untouched."""
    folder = tmp_path_factory.mktemp("errors")
    with tempfile.TemporaryDirectory(prefix="dpm-") as short:
        gate = Gate(write_policy(folder), f"unix:{Path(short) / 'gate.sock'}")
        yield gate
        gate.stop()


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


def test_the_padding_clock_runs_from_the_accept(tmp_path: Path):
    """A client that connects, waits 0.3 s and only then sends its query is answered one
    quantum (0.6 s) after it connected: how soon the request was read is inside the
    pad. A clock started at the headers, as the gate's first was, answers at 0.9 s."""
    with tempfile.TemporaryDirectory(prefix="dpm-") as short:
        gate = Gate(write_policy(tmp_path, "response_quantum_ms = 600"), f"unix:{short}/g.sock")
        try:
            conn = connection(gate.address)
            conn.connect()
            start = time.monotonic()
            time.sleep(0.3)
            conn.request("POST", "/v1/query", body=json.dumps(COUNT))
            response = conn.getresponse()
            response.read()
            elapsed = time.monotonic() - start
        finally:
            gate.stop()
    assert response.status == 200
    assert 0.55 <= elapsed < 0.85, elapsed
