"""Malformed request bodies: each is a ``400 bad_request`` that charges nothing
and says so, on a real gate over its unix socket and in the engine itself.

Before, a number with hundreds of digits overflowed inside the engine and was
answered ``500 failed`` with "the query failed after it was charged", and JSON
nested 100,000 deep raised ``RecursionError`` the same way, though nothing had
been charged.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmagic.client import Gate
from dpmagic.gate.service.body import MAX_DEPTH
from tests.conftest import GateProcess, write_dataset
from tests.system.test_server import call

SQL = "SELECT COUNT(*) FROM t"
NOTHING = "nothing was charged"


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# Each a whole request body, as bytes on the wire.
BAD_BODIES = {
    "int with 400 digits": f'{{"sql": "{SQL}", "epsilon": 1{"0" * 399}}}',
    "int past Python's 4300-digit limit": f'{{"sql": "{SQL}", "epsilon": {"9" * 5000}}}',
    "float that overflows": f'{{"sql": "{SQL}", "epsilon": 1e400}}',
    "float with 300 digits": f'{{"sql": "{SQL}", "epsilon": 0.{"1" * 300}}}',
    "NaN": f'{{"sql": "{SQL}", "epsilon": NaN}}',
    "Infinity": f'{{"sql": "{SQL}", "accuracy": Infinity}}',
    "nested 100,000 deep": f'{{"sql": "{SQL}", "params": {{"a": {_nested(100_000)}}}}}',
    "nested just past the limit": f'{{"sql": "{SQL}", "params": {{"a": {_nested(MAX_DEPTH)}}}}}',
    "a 900 kB notebook name": json.dumps({"sql": SQL, "notebook": "n" * 900_000}),
    "a 900 kB dataset name": json.dumps({"sql": SQL, "dataset": "d" * 900_000}),
    "a 900 kB unknown field": json.dumps({"sql": SQL, "x" * 900_000: 1}),
    "not UTF-8": '{"sql": "\udcff"}',
    "a flag that is a string": json.dumps({"sql": SQL, "fresh": "yes"}),
}


def _wire(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


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
    status, reply = call(gate.address, "POST", "/v1/query", raw=_wire(BAD_BODIES[name]))
    assert (status, reply["error"]["kind"]) == (400, "bad_request"), reply
    assert reply["error"]["message"].endswith(NOTHING)
    assert len(reply["error"]["message"]) < 1000  # the client's text is not echoed whole
    client = Gate(gate.address)
    assert client.budget()["user"]["spent"]["epsilon"] == 0.0
    assert client.history()["entries"] == []
