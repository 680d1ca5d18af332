"""Malformed request bodies: each is a ``400 bad_request`` that charges nothing and says
so, on a real gate over its unix socket and in the engine itself.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject,
and the helpers used here, are in tests/unit/test_bad_bodies.py."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmagic.client.http_gate import Gate
from tests.bad_bodies import BAD_BODIES, NOTHING, wire
from tests.conftest import GateProcess, write_dataset
from tests.server_gate import call


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    folder = tmp_path_factory.mktemp("bodies")
    with tempfile.TemporaryDirectory(prefix="dpm-") as short:
        process = GateProcess(write_dataset(folder), f"unix:{Path(short) / 'gate.sock'}")
        process.start()
        try:
            yield process
        finally:
            process.stop()


@pytest.mark.parametrize("name", BAD_BODIES)
def test_a_real_gate_answers_400_and_charges_nothing(gate: GateProcess, name: str) -> None:
    status, reply = call(gate.address, "POST", "/v1/query", raw=wire(BAD_BODIES[name]))
    assert (status, reply["error"]["kind"]) == (400, "bad_request"), reply
    assert reply["error"]["message"].endswith(NOTHING)
    assert len(reply["error"]["message"]) < 1000  # the client's text is not echoed whole
    client = Gate(gate.address)
    assert client.budget()["user"]["spent"]["epsilon"] == 0.0
    assert client.history()["entries"] == []
