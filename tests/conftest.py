"""Shared fixtures: a real gate process on a unix socket, over a small dataset.

The kernel-side tests talk to the same server the notebook would, started as
a subprocess (``python -m dpmagic.gate.service.server``), so what they check is the
HTTP contract of docs/http-api.md rather than a stand-in for it.
"""

from __future__ import annotations

import contextlib
import os
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

# The small dataset behind `gate`: 200 people, one row each.
POLICY = """\
[gate]
state_dir = "state"

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = { epsilon = 5.0 }
notebook_budget = { epsilon = 2.0 }
query_default = { epsilon = 0.1 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
age = { type = "int", lower = 0, upper = 100 }
sex = { type = "int", public_values = [0, 1] }
"""
PEOPLE = 200
START_TIMEOUT_S = 60.0
# What a gate's log says when one of its processes died of a signal (faulthandler's
# report, and the supervisor's line for a worker).
CRASH_MARKS = ("Fatal Python error", "was killed by SIG")
# sun_path holds 108 bytes; pytest's tmp_path can be longer than that.
MAX_SOCKET_PATH = 100


# Markers of system suites with a line of their own in .ci/run; every other test under
# tests/system/ is marked ``system``. The default run (``pytest -q``) leaves them all out.
OWN_SUITES = ("browser", "hub", "audit", "signals", "flood", "fuzz", "spark")
# Every marker that gives a test a CI run of its own (``.ci/run``'s ``-m`` lines, the
# default run's ``addopts`` exclusions); tests/unit/test_ci_runs.py holds the three equal.
CI_SUITES = ("system", "search", *OWN_SUITES)
SYSTEM_TESTS = Path(__file__).resolve().parent / "system"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests under tests/system/ before ``-m`` selects (see ``OWN_SUITES``),
    then refuse a test with two suite markers: CI would run it twice, and moving a
    test out of one run must leave it in exactly one other. This runs before ``-m``
    deselects, so the default run checks every test collected."""
    for item in items:
        if SYSTEM_TESTS in item.path.parents and not any(
            item.get_closest_marker(m) for m in OWN_SUITES
        ):
            item.add_marker(pytest.mark.system)
    twice = [
        f"{item.nodeid} ({', '.join(suites)})"
        for item in items
        if len(suites := [m for m in CI_SUITES if item.get_closest_marker(m)]) > 1
    ]
    if twice:
        raise pytest.UsageError("tests in more than one CI run: " + "; ".join(twice))


TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}


def write_dataset(folder: Path, gate_options: str = "") -> Path:
    """Write the policy (with extra ``[gate]`` lines) and its CSV into ``folder``.

    Padding is off unless ``gate_options`` set it: it is on by default, and the
    tests that rely on it say so."""
    if "response_quantum_ms" not in gate_options:
        gate_options += "response_quantum_ms = 0\n"
    rows = [f"{pid},{20 + pid % 60},{pid % 2}" for pid in range(PEOPLE)]
    (folder / "t.csv").write_text("pid,age,sex\n" + "\n".join(rows) + "\n")
    policy = folder / "policy.toml"
    policy.write_text(POLICY.replace("[gate]\n", f"[gate]\n{gate_options}", 1))
    return policy


class GateProcess:
    """A gate subprocess that can be stopped and started again on the same state.

    ``address`` is what the gate says it listens on, in the client's form
    (``unix:/abs/path`` or ``http://host:port``).
    """

    def __init__(self, policy: Path, listen: str) -> None:
        self.policy = policy
        self.listen = listen
        self.address = ""
        self.proc: subprocess.Popen[str] | None = None

    @property
    def state_dir(self) -> Path:
        return self.policy.parent / "state"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dpmagic.gate.service.server",
                "--policy",
                str(self.policy),
                "--listen",
                self.listen,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("DPMAGIC_")},
        )
        line = self._first_line()
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(f"the gate did not start: {line!r}")
        address = line.split("listening on ", 1)[1].strip()
        self.address = (
            "http://" + address.removeprefix("tcp:") if address.startswith("tcp:") else address
        )
        # A restarted TCP gate must come back on the same port.
        self.listen = address

    def _first_line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            line = self.proc.stdout.readline() if ready else ""
            if line:
                return line
            if ready or self.proc.poll() is not None:  # end of output: it exited
                self.proc.wait(timeout=10)
                return self.proc.stderr.read() if self.proc.stderr else ""
        return ""

    def stop(self) -> None:
        """SIGTERM, as a service manager would; the gate must exit cleanly."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._report_crash()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.proc = None

    def _report_crash(self) -> None:
        """Print the gate's log if one of its processes died of a signal (the stacks
        ``faulthandler`` wrote, the supervisor's line naming the signal): a test that
        failed because the gate crashed then shows why, where the log would otherwise
        be closed unread. Reads only what is there now, never waiting for it."""
        assert self.proc is not None
        stream = self.proc.stderr
        if stream is None or stream.closed:
            return
        fd = stream.fileno()
        os.set_blocking(fd, False)
        chunks = []
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        log = b"".join(chunks).decode(errors="replace")
        if any(mark in log for mark in CRASH_MARKS):
            print(f"the gate's log (it crashed):\n{log}", file=sys.stderr)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def short_dir(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, or a shorter temporary folder when a socket path would not fit."""
    if len(str(tmp_path / "gate.sock")) <= MAX_SOCKET_PATH:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="dpm-") as short:
        yield Path(short)


@pytest.fixture
def gate(tmp_path: Path, short_dir: Path) -> Iterator[GateProcess]:
    """A running gate over `POLICY` with fresh budgets, stopped after the test."""
    process = GateProcess(write_dataset(tmp_path), f"unix:{short_dir / 'gate.sock'}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def workers_gate(tmp_path: Path, short_dir: Path) -> Iterator[GateProcess]:
    """`gate`'s policy served by two worker processes (``gate.workers = 2``)."""
    policy = write_dataset(tmp_path, "workers = 2\n")
    process = GateProcess(policy, f"unix:{short_dir / 'gate.sock'}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def tcp_gate(tmp_path: Path) -> Iterator[GateProcess]:
    """A running gate on TCP (loopback, a free port) that wants the bearer tokens `TOKENS`."""
    tokens = "[users]\n" + "".join(f'{user} = "{token}"\n' for user, token in TOKENS.items())
    (tmp_path / "tokens.toml").write_text(tokens)
    (tmp_path / "tokens.toml").chmod(0o600)
    process = GateProcess(
        write_dataset(tmp_path, 'tokens_file = "tokens.toml"\n'), f"tcp:127.0.0.1:{free_port()}"
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A loopback port free now, and never one this process was given before: ports
    asked for together (a Hub's proxy, the Hub, a service) are bound only later, so
    the system may offer the same free port twice in a row (CI once gave a Hub's proxy
    and the Hub both 49813, and the Hub could not bind)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port
