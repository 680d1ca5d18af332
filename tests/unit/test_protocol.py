"""The query request's one struct (``dpmagic/protocol.py``): what the client sends is
what the gate reads, field for field, and a newer request is refused by name."""

from __future__ import annotations

import inspect

import pytest

from dpmagic.client.asking import Asking
from dpmagic.gate.failures import InvalidBody
from dpmagic.gate.request import QueryRequest
from dpmagic.protocol import FIELDS, WIRE_VERSION, Ask

# Keywords of ``query`` that never travel: a mock run is answered in the kernel.
LOCAL = {"mock", "mock_rows"}


def test_every_field_is_a_keyword_of_query_and_back() -> None:
    keywords = set(inspect.signature(Asking.query).parameters) - {"self"}
    assert keywords - LOCAL == FIELDS - {"version"}


def test_the_gate_reads_what_the_client_sends() -> None:
    ask = Ask(
        sql="SELECT COUNT(*) FROM t", epsilon=0.5, delta=1e-7, dataset="d", notebook="n.ipynb",
        dry_run=True, fresh=True, params={"a": [1, 2]}, max_partitions=2,
        max_rows_per_partition=3, clip=0.25,
    )  # fmt: skip
    request = QueryRequest.from_body(ask.body())
    for field in FIELDS - {"version"}:
        if field in ("accuracy", "alpha", "bounding_report"):
            continue  # these three go without ``clip``; next test
        assert getattr(request, field) == getattr(ask, field), field


def test_accuracy_and_report_travel() -> None:
    request = QueryRequest.from_body(Ask(sql="s", accuracy=3.0, alpha=0.1).body())
    assert (request.accuracy, request.alpha, request.epsilon) == (3.0, 0.1, None)
    request = QueryRequest.from_body(Ask(sql="s", epsilon=1.0, bounding_report=0.2).body())
    assert request.bounding_report == 0.2


def test_defaults_are_left_out_of_the_body() -> None:
    assert Ask(sql="s").body() == {"sql": "s"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"sql": "s", "epsilon": "1"}, "`epsilon` must be a finite number"),
        ({"sql": "s", "epsilon": True}, "`epsilon` must be a finite number"),
        ({"sql": 3}, "`sql` must be a string"),
        ({"epsilon": 1}, "`sql` must be a string"),
        ({"sql": "s", "dry_run": "yes"}, "`dry_run` must be true or false"),
        ({"sql": "s", "max_partitions": 1.5}, "`max_partitions` must be a whole number ≥ 1"),
        ({"sql": "s", "max_partitions": 0}, "`max_partitions` must be a whole number ≥ 1"),
        ({"sql": "s", "params": [1]}, "`params` must be an object"),
        ({"sql": "s", "notebook": 7}, "`notebook` must be a short string"),
        ({"sql": "s", "version": 0}, "`version` must be a whole number ≥ 1"),
        ({"sql": "s", "nope": 1}, "unknown field 'nope'"),
        ([1], "the request body must be a JSON object"),
    ],
)
def test_a_wrong_shape_is_named_by_its_field(body: object, message: str) -> None:
    with pytest.raises(InvalidBody, match=message):
        QueryRequest.from_body(body)


def test_a_newer_request_is_refused_by_name() -> None:
    with pytest.raises(InvalidBody, match=f"up to version {WIRE_VERSION}, not {WIRE_VERSION + 1}"):
        QueryRequest.from_body({"sql": "s", "version": WIRE_VERSION + 1})
    assert QueryRequest.from_body({"sql": "s", "version": WIRE_VERSION}).sql == "s"
