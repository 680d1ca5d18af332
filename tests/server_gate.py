"""A gate as a child process (``python -m dpmagic.gate.service.server``) and raw HTTP
to it: the policy, the tokens, the connections and a call, shared by the server's
unit and system tests and the malformed-body tests."""

from __future__ import annotations

import http.client
import json
import select
import signal
import socket
import subprocess
import sys
import tempfile
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


def call(
    address: str,
    method: str,
    path: str,
    body: object = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict]:
    conn = connection(address)
    try:
        payload = raw if raw is not None else None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=payload, headers=headers or {})
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(response.read())
    finally:
        conn.close()
