"""A grammar-based differential fuzzer for the gate's error oracle.

Here the long runs (``pytest -m fuzz``: thousands of examples) and the runs through
real gate processes over their sockets; the default run is in
tests/unit/test_fuzz_error_oracle.py, the fuzzer's parts in tests/error_oracle.py."""

# ruff: noqa: F811 - the fuzzer's fixtures are tests/error_oracle.py's

from __future__ import annotations

import http.client
import itertools
import json
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import GateProcess
from tests.error_oracle import (  # noqa: F401
    DEFAULT,
    EPSILON,
    FUZZ,
    KEYED_QUERIES,
    LEFT_QUERIES,
    PER_PERSON_QUERIES,
    RELEASE_QUERIES,
    ROW_QUERIES,
    SEMI_QUERIES,
    STAGED_QUERIES,
    Pair,
    compare,
    folder,
    pair,
    write_database,
)

# -- properties: a fixed budget in the default run, thousands under -m fuzz -----------


@pytest.mark.fuzz
@FUZZ
@given(sql=ROW_QUERIES)
def test_fuzz_row_expressions_never_hinge_on_one_unit(pair: Pair, sql: str) -> None:
    compare(pair, sql)


@pytest.mark.fuzz
@settings(FUZZ, max_examples=500)
@given(sql=RELEASE_QUERIES)
def test_fuzz_release_expressions_differ_by_noise_only(pair: Pair, sql: str) -> None:
    compare(pair, sql, release_level=True)


@pytest.mark.fuzz
@settings(FUZZ, max_examples=300)
@given(sql=st.one_of(SEMI_QUERIES, LEFT_QUERIES))
def test_fuzz_conditions_in_semi_joins_and_join_conditions(pair: Pair, sql: str) -> None:
    compare(pair, sql)


@pytest.mark.fuzz
@settings(FUZZ, max_examples=300)
@given(sql=PER_PERSON_QUERIES)
def test_fuzz_per_person_subqueries_never_hinge_on_one_unit(pair: Pair, sql: str) -> None:
    compare(pair, sql)


@pytest.mark.fuzz
@settings(FUZZ, max_examples=200)
@given(sql=st.one_of(STAGED_QUERIES, KEYED_QUERIES))
def test_fuzz_releases_inside_a_query_differ_by_noise_only(pair: Pair, sql: str) -> None:
    compare(pair, sql, release_level=True)


# -- the same through real gate processes on their unix sockets ------------------------

_process_queries = itertools.count()


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _post(address: str, sql: str, notebook: str) -> tuple[int, str, str, tuple]:
    """The HTTP status, error kind and message, and an answer's data-free shape."""
    conn = _Unix(address.removeprefix("unix:"))
    body = {"sql": sql, "epsilon": EPSILON, "fresh": True, "notebook": notebook}
    try:
        conn.request("POST", "/v1/query", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        status, reply = response.status, json.loads(response.read())
    finally:
        conn.close()
    if "error" in reply:
        return status, reply["error"]["kind"], reply["error"]["message"], ()
    shape = (tuple(reply["columns"]), len(reply["rows"]), json.dumps(reply["cost"]))
    return status, "ok", "", (*shape, json.dumps(reply["budget"]["notebook"]["spent"]))


@pytest.fixture(scope="module")
def processes(folder: Path) -> Iterator[dict[str, GateProcess]]:
    sockets = Path(tempfile.mkdtemp(prefix="dpm-", dir="/tmp"))
    gates = {}
    try:
        for name, with_target in (("pwith", True), ("pwithout", False)):
            gates[name] = GateProcess(
                write_database(folder, name, with_target), f"unix:{sockets / name}.sock"
            )
            gates[name].start()
        yield gates
    finally:
        for g in gates.values():
            g.stop()
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()


def _compare_over_sockets(processes: dict[str, GateProcess], sql: str) -> None:
    notebook = f"sock{next(_process_queries)}"
    a, b = (_post(g.address, sql, notebook) for g in processes.values())
    assert a == b, f"the reply hinges on the target unit: {sql}\n  D : {a}\n  D': {b}"


@settings(DEFAULT, max_examples=12)
@given(sql=ROW_QUERIES)
def test_statuses_over_the_socket_never_hinge_on_one_unit(processes, sql: str) -> None:
    _compare_over_sockets(processes, sql)


@pytest.mark.fuzz
@settings(FUZZ, max_examples=100)
@given(sql=ROW_QUERIES)
def test_fuzz_statuses_over_the_socket_never_hinge_on_one_unit(processes, sql: str) -> None:
    _compare_over_sockets(processes, sql)
