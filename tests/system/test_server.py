"""The gate as a real subprocess: HTTP over a real unix socket and over TCP with tokens,
identity, error replies, padding, and a clean SIGTERM.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject,
and the helpers used here, are in tests/unit/test_server.py."""

# ruff: noqa: F811 - fixtures shared with the unit tests are imported from them

from __future__ import annotations

import os
import pwd
import signal
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmagic.commands.init_policy import write_skeleton
from dpmagic.gate.policy import DEFAULT_QUANTUM_MS, load_policy
from dpmagic.gate.service.exchange import HEADER_DEADLINE_S
from dpmagic.gate.service.process import ANONYMOUS_CONNECTIONS, USER_CONNECTIONS
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


@pytest.fixture
def unix_gate(tmp_path: Path, short_dir: Path) -> Iterator[Gate]:
    gate = Gate(write_policy(tmp_path), f"unix:{short_dir / 'gate.sock'}")
    yield gate
    gate.stop()


def test_unix_gate_answers_queries_and_charges_them(
    unix_gate: Gate, short_dir: Path, tmp_path: Path
) -> None:
    sock = short_dir / "gate.sock"
    assert unix_gate.line == f"dpmagic gate listening on unix:{sock}\n"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o666
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    address = unix_gate.address
    assert call(address, "GET", "/v1/health") == (200, {"ok": True})

    status, reply = call(address, "POST", "/v1/query", {**COUNT, "notebook": "a.ipynb"})
    assert status == 200, reply
    assert {"columns", "rows", "cost", "budget", "accuracy", "replayed"} <= set(reply)
    assert reply["cost"] == {"epsilon": 0.5, "delta": 0.0}
    assert len(reply["rows"]) == 1 and reply["replayed"] is False

    status, budget = call(address, "GET", "/v1/budget?dataset=d&notebook=a.ipynb")
    assert status == 200, budget
    assert budget["user"]["spent"]["epsilon"] == pytest.approx(0.5)
    assert budget["notebook"]["spent"]["epsilon"] == pytest.approx(0.5)
    status, other = call(address, "GET", "/v1/budget?notebook=b.ipynb")
    assert other["notebook"]["spent"]["epsilon"] == 0.0

    status, schema = call(address, "GET", "/v1/schema?dataset=d")
    assert status == 200 and schema["dataset"] == "d" and "t" in schema["tables"]

    code, err = unix_gate.stop()
    assert code == 0, err
    assert not sock.exists()
    # The access log names who asked, never what they asked.
    me = pwd.getpwuid(os.getuid()).pw_name
    assert f"{me} POST /v1/query 200" in err
    assert "COUNT" not in err and "SELECT" not in err


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "kind"),
    [
        ("POST", "/v1/query", {"raw": b'{"sql": '}, 400, "bad_request"),
        ("POST", "/v1/query", {"raw": b"\xff\xfe"}, 400, "bad_request"),
        ("POST", "/v1/query", {"body": ["not", "an", "object"]}, 400, "bad_request"),
        ("POST", "/v1/query", {"body": {"sql": "DELETE FROM t"}}, 400, "refused"),
        ("POST", "/v1/query", {"body": {**COUNT, "epsilon": 1.5}}, 403, "budget"),
        ("POST", "/v1/query?x=1", {"body": COUNT}, 400, "bad_request"),
        ("GET", "/v1/query", {}, 405, "bad_request"),
        ("GET", "/v1/nothing", {}, 404, "bad_request"),
        ("GET", "/v1/budget?dataset=nope", {}, 400, "bad_request"),
        ("GET", "/v1/budget?dataset=d&dataset=d", {}, 400, "bad_request"),
        ("GET", "/v1/schema?colour=red", {}, 400, "bad_request"),
        ("DELETE", "/v1/query", {}, 501, "bad_request"),
    ],
)
def test_errors_are_json_with_a_kind(
    shared_gate: Gate, method: str, path: str, kwargs: dict, status: int, kind: str
) -> None:
    got, reply = call(shared_gate.address, method, path, **kwargs)
    assert (got, reply["error"]["kind"]) == (status, kind), reply
    assert isinstance(reply["error"]["message"], str)
    _, budget = call(shared_gate.address, "GET", "/v1/budget")
    assert budget["user"]["spent"]["epsilon"] == 0.0  # no error costs anything


def test_sigint_also_stops_cleanly(unix_gate: Gate, short_dir: Path) -> None:
    assert call(unix_gate.address, "GET", "/v1/health")[0] == 200
    code, err = unix_gate.stop(signal.SIGINT)
    assert code == 0, err
    assert not (short_dir / "gate.sock").exists()


def test_a_stale_socket_is_replaced_but_a_live_gate_is_not(tmp_path: Path, short_dir: Path) -> None:
    sock = short_dir / "gate.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock))
    dead.close()  # leaves the file behind, as a gate killed with SIGKILL would
    assert sock.exists()

    policy = write_policy(tmp_path)
    first = Gate(policy, f"unix:{sock}")
    try:
        assert call(first.address, "GET", "/v1/health")[0] == 200
        # The same policy started twice: the second stops before touching the state.
        second = Gate(policy, f"unix:{sock}")
        code, err = second.stop()
        assert second.line == ""
        assert code == 2 and "another gate is already listening" in err
        assert call(first.address, "POST", "/v1/query", COUNT)[0] == 200
    finally:
        assert first.stop()[0] == 0
    assert not sock.exists()


def test_tcp_needs_a_tokens_file(tmp_path: Path) -> None:
    gate = Gate(write_policy(tmp_path), "tcp:127.0.0.1:0")
    code, err = gate.stop()
    assert gate.line == ""
    assert code == 2 and "gate.tokens_file" in err


def test_a_tokens_file_readable_by_others_stops_the_gate(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[users]\nalice = "{ALICE_TOKEN}"\n')
    tokens.chmod(0o644)
    gate = Gate(write_policy(tmp_path, 'tokens_file = "tokens.toml"'), "tcp:127.0.0.1:0")
    code, err = gate.stop()
    assert gate.line == ""
    assert code == 2
    assert err.strip().splitlines() == [
        f"dpmagic: error: tokens file {tokens} is accessible by group or others (mode 0644); "
        f"anyone who reads it can act as its users: run `chmod 600 {tokens}`"
    ]


def test_tcp_gate_identifies_users_by_token(tmp_path: Path) -> None:
    (tmp_path / "tokens.toml").write_text(
        f'[users]\nalice = "{ALICE_TOKEN}"\nbob = "{BOB_TOKEN}"\n'
    )
    (tmp_path / "tokens.toml").chmod(0o600)
    gate = Gate(write_policy(tmp_path, 'tokens_file = "tokens.toml"'), "tcp:127.0.0.1:0")
    try:
        address = gate.address
        host, _, port = address.removeprefix("tcp:").rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        assert call(address, "GET", "/v1/health") == (200, {"ok": True})

        for headers in ({}, {"Authorization": "Bearer not-a-valid-token-at-all"}):
            for method, path, body in (("GET", "/v1/budget", None), ("POST", "/v1/query", COUNT)):
                status, reply = call(address, method, path, body, headers=headers)
                assert (status, reply["error"]["kind"]) == (401, "auth")

        alice = {"Authorization": f"Bearer {ALICE_TOKEN}"}
        bob = {"Authorization": f"Bearer {BOB_TOKEN}"}
        status, reply = call(address, "POST", "/v1/query", COUNT, headers=alice)
        assert status == 200, reply
        assert reply["budget"]["user"]["spent"]["epsilon"] == pytest.approx(0.5)
        _, budget = call(address, "GET", "/v1/budget", headers=alice)
        assert budget["user"]["spent"]["epsilon"] == pytest.approx(0.5)
        _, budget = call(address, "GET", "/v1/budget", headers=bob)
        assert budget["user"]["spent"]["epsilon"] == 0.0
    finally:
        code, err = gate.stop()
    assert code == 0, err
    assert "alice POST /v1/query 200" in err
    assert ALICE_TOKEN not in err


def test_replies_that_read_the_data_are_padded_and_others_leave_at_once(
    tmp_path: Path, short_dir: Path
) -> None:
    """A run on the private data is padded to the quantum; a replay of it, a refusal,
    a malformed body and the health check read none and are answered at once
    (docs/security.md, "Which replies are padded"; timed against the data in
    tests/system/test_padding.py)."""
    quantum = 0.3
    policy = write_policy(tmp_path, f"response_quantum_ms = {quantum * 1000:g}")
    gate = Gate(policy, f"unix:{short_dir / 'gate.sock'}")
    try:
        padded = [
            {"body": COUNT},  # answered
            {"body": {**COUNT, "epsilon": 0.1, "fresh": True}},
        ]
        at_once = [
            ("POST", "/v1/query", {"body": COUNT}),  # a replay of the first
            ("POST", "/v1/query", {"body": {"sql": "SELECT age FROM t"}}),  # refused
            ("POST", "/v1/query", {"raw": b"{"}),  # malformed
            ("GET", "/v1/health", {}),
        ]
        for kwargs in padded:
            started = time.monotonic()
            call(gate.address, "POST", "/v1/query", **kwargs)
            elapsed = time.monotonic() - started
            # The gate holds the reply until a whole number of quanta after it
            # accepted the connection; what is left over is the local round trip.
            assert elapsed >= quantum
            assert elapsed % quantum < 0.1, elapsed
        for method, path, kwargs in at_once:
            started = time.monotonic()
            status, reply = call(gate.address, method, path, **kwargs)
            assert time.monotonic() - started < quantum / 2, (path, kwargs)
            if kwargs.get("body") == COUNT:
                assert status == 200 and reply["replayed"] is True
    finally:
        code, err = gate.stop()
    assert code == 0, err


def test_padding_is_on_by_default(tmp_path: Path, short_dir: Path) -> None:
    """A policy that says nothing of padding gets the default quantum, and so does
    the skeleton `dpmagic init` writes; a gate on such a policy pads."""
    # Above the p99.9 of cheap replies measured by benchmarks/reply_jitter.py (README).
    assert DEFAULT_QUANTUM_MS >= 200
    policy = tmp_path / "policy.toml"
    write_policy(tmp_path)
    policy.write_text(POLICY.format(gate=""))  # no response_quantum_ms at all
    assert load_policy(policy).gate.response_quantum_ms == DEFAULT_QUANTUM_MS
    skeleton = write_skeleton([tmp_path / "t.csv"], "pid", tmp_path / "init.toml")
    assert "response_quantum_ms" in skeleton.read_text()
    assert load_policy(skeleton).gate.response_quantum_ms == DEFAULT_QUANTUM_MS

    gate = Gate(policy, f"unix:{short_dir / 'gate.sock'}")
    try:
        quantum = DEFAULT_QUANTUM_MS / 1000
        for _ in range(3):
            started = time.monotonic()
            body = {**COUNT, "epsilon": 0.1, "fresh": True}  # a run each time: padded
            status, _ = call(gate.address, "POST", "/v1/query", body)
            elapsed = time.monotonic() - started
            assert status == 200
            assert elapsed >= quantum and elapsed % quantum < 0.1 * quantum + 0.05, elapsed
    finally:
        code, err = gate.stop()
    assert code == 0, err


def _silent(address: str) -> socket.socket:
    """A connection that sends nothing."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address.removeprefix("unix:"))
    else:
        host, _, port = address.removeprefix("tcp:").rpartition(":")
        sock = socket.create_connection((host, int(port)))
    sock.settimeout(HEADER_DEADLINE_S + 5)
    return sock


def test_a_user_holding_too_many_connections_is_refused_until_they_close(
    unix_gate: Gate,
) -> None:
    """The cap applies at accept, before a byte is read; the header deadline frees them."""
    held = [_silent(unix_gate.address) for _ in range(USER_CONNECTIONS)]
    try:
        status, reply = call(unix_gate.address, "GET", "/v1/health")
        assert (status, reply["error"]["kind"]) == (503, "busy"), reply
        assert f"{USER_CONNECTIONS} connections open" in reply["error"]["message"]
        held.pop().close()
        time.sleep(0.2)  # the gate sees the close on its next loop turn
        assert call(unix_gate.address, "GET", "/v1/health") == (200, {"ok": True})
        # Silent connections are closed at the header deadline, with no reply.
        started = time.monotonic()
        assert held[0].recv(1) == b""
        assert HEADER_DEADLINE_S - 0.5 < time.monotonic() - started + 0.2 < HEADER_DEADLINE_S + 3
    finally:
        for sock in held:
            sock.close()
    status, reply = call(unix_gate.address, "POST", "/v1/query", COUNT)
    assert status == 200, reply


def test_tcp_connections_without_headers_cannot_crowd_out_a_user(tmp_path: Path) -> None:
    """Over TCP the caller is unknown until its headers: a full pool of silent
    connections loses its oldest to each newcomer, so a real request gets in."""
    (tmp_path / "tokens.toml").write_text(f'[users]\nalice = "{ALICE_TOKEN}"\n')
    (tmp_path / "tokens.toml").chmod(0o600)
    gate = Gate(write_policy(tmp_path, 'tokens_file = "tokens.toml"'), "tcp:127.0.0.1:0")
    held: list[socket.socket] = []
    try:
        held = [_silent(gate.address) for _ in range(ANONYMOUS_CONNECTIONS)]
        alice = {"Authorization": f"Bearer {ALICE_TOKEN}"}
        status, reply = call(gate.address, "POST", "/v1/query", COUNT, headers=alice)
        assert status == 200, reply
        assert held[0].recv(1) == b""  # the oldest silent one made room
    finally:
        for sock in held:
            sock.close()
        code, err = gate.stop()
    assert code == 0, err
