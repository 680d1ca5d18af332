"""Malformed request bodies: each is a ``400 bad_request`` that charges nothing
and says so, on a real gate over its unix socket and in the engine itself.

Before, a number with hundreds of digits overflowed inside the engine and was
answered ``500 failed`` with "the query failed after it was charged", and JSON
nested 100,000 deep raised ``RecursionError`` the same way, though nothing had
been charged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import InvalidBody
from dpmagic.gate.policy import load_policy
from dpmagic.gate.request import QueryRequest
from dpmagic.gate.service.body import MAX_DEPTH, MAX_NUMBER_CHARS, parse_body
from tests.bad_bodies import BAD_BODIES, NOTHING, SQL, nested, wire
from tests.conftest import write_dataset


@pytest.mark.parametrize("name", BAD_BODIES)
def test_the_parser_refuses_each_kind(name: str) -> None:
    body = wire(BAD_BODIES[name])
    try:
        request = parse_body(body)
    except InvalidBody as refused:
        assert refused.status == 400 and refused.kind == "bad_request"
        assert refused.message.endswith(NOTHING)
        return
    # Well-formed JSON whose fields are wrong: the engine's form check refuses it.
    with pytest.raises(InvalidBody, match=NOTHING):
        QueryRequest.from_body(request)


def test_the_limits_leave_honest_bodies_alone() -> None:
    def body(depth: int) -> bytes:
        return (
            f'{{"sql": "{SQL}", "epsilon": 0.1000000000000000055511151231257827, '
            f'"params": {{"a": {nested(depth)}, "b": -9223372036854775808}}}}'
        ).encode()

    # body → params → the list's own levels: the innermost list is at depth 1 + depth.
    parsed = parse_body(body(MAX_DEPTH - 2))
    assert parsed["params"]["b"] == -(2**63)
    with pytest.raises(InvalidBody, match="nested"):
        parse_body(body(MAX_DEPTH - 1))
    assert parse_body(b"1" * MAX_NUMBER_CHARS) == int("1" * MAX_NUMBER_CHARS)
    with pytest.raises(InvalidBody, match="characters"):
        parse_body(b"1" * (MAX_NUMBER_CHARS + 1))


def test_the_engine_refuses_a_big_int_before_the_debit(tmp_path: Path) -> None:
    """In-process callers may pass a Python int no JSON parser would make."""
    engine = Engine(load_policy(write_dataset(tmp_path)))
    try:
        for epsilon in (10**400, -(10**400)):
            with pytest.raises(InvalidBody, match=NOTHING):
                engine.query("alice", {"sql": SQL, "epsilon": epsilon})
        assert engine.budget("alice", None, None)["user"]["spent"]["epsilon"] == 0.0
        assert engine.query("alice", {"sql": SQL, "epsilon": 10**0})["cost"]["epsilon"] == 1.0
    finally:
        engine.close()
