"""Query texts refused for their form, with a message that says what is wrong.

Before, ``SELECT … UNION ALL SELECT …`` was refused as "only SELECT queries are
allowed, not SELECT", and a lone surrogate in the SQL (JSON's ``"\\ud800"``) as
"the gate could not analyse this query (TypeError)" (in the notebook's name,
an unexpected ``UnicodeEncodeError``). Each is now refused by name, before
anything is charged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import InvalidBody, Refused
from dpmagic.gate.policy import load_policy
from dpmagic.gate.request import QueryRequest
from dpmagic.gate.service.body import parse_body
from dpmagic.gate.sql.parse import parse
from tests.conftest import write_dataset

COUNT = "SELECT COUNT(*) FROM t"
SET_OPERATIONS = {
    f"{COUNT} UNION ALL {COUNT}": "UNION ALL",
    f"{COUNT} UNION {COUNT}": "UNION",
    f"{COUNT} UNION ALL BY NAME {COUNT}": "UNION ALL BY NAME",
    f"{COUNT} INTERSECT {COUNT}": "INTERSECT",
    f"{COUNT} INTERSECT ALL {COUNT}": "INTERSECT ALL",
    f"{COUNT} EXCEPT {COUNT}": "EXCEPT",
    f"{COUNT} EXCEPT ALL {COUNT}": "EXCEPT ALL",
    f"({COUNT}) UNION ALL ({COUNT})": "UNION ALL",
    f"WITH a AS (SELECT * FROM t) SELECT COUNT(*) FROM a UNION {COUNT}": "UNION",
}


@pytest.fixture
def engine(tmp_path: Path):
    engine = Engine(load_policy(write_dataset(tmp_path)))
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def unspent_engine(tmp_path_factory: pytest.TempPathFactory):
    """One engine for the refusals that check nothing was spent: none of them charges
    it, so a charge one let through shows in its own check and every later one's."""
    engine = Engine(load_policy(write_dataset(tmp_path_factory.mktemp("unspent"))))
    try:
        yield engine
    finally:
        engine.close()


def _spent(engine: Engine) -> dict[str, float]:
    return engine.budget("alice", None, None)["user"]["spent"]


@pytest.mark.parametrize("sql", SET_OPERATIONS)
def test_each_set_operation_is_refused_by_name(sql: str) -> None:
    with pytest.raises(Refused) as refused:
        parse(sql)
    message = refused.value.message
    assert message.startswith(f"{SET_OPERATIONS[sql]} is not supported: set operations ")
    assert "(UNION, INTERSECT, EXCEPT)" in message
    assert "as a query of its own" in message and "GROUP BY" in message
    assert "only SELECT queries" not in message


def test_a_set_operation_costs_nothing_and_other_statements_keep_their_message(
    engine: Engine,
) -> None:
    for sql in SET_OPERATIONS:
        with pytest.raises(Refused, match="is not supported: set operations"):
            engine.query("alice", {"sql": sql, "epsilon": 1.0})
    assert _spent(engine) == {"epsilon": 0.0, "delta": 0.0}
    with pytest.raises(Refused, match="only SELECT queries are allowed, not ATTACH"):
        parse("ATTACH 'x.db' AS o")
    assert engine.query("alice", {"sql": COUNT, "epsilon": 1.0})["cost"]["epsilon"] == 1.0


# Each a body as sent on the wire: JSON escapes that decode to a lone surrogate.
SURROGATES = {
    "in the SQL": (
        r'{"sql": "SELECT COUNT(*) FROM t WHERE \u0027a\u0027 = \u0027\ud800\u0027"}',
        "the query text is not valid Unicode (a lone surrogate, U+D800, at character 37)",
    ),
    "in a comment": (
        r'{"sql": "SELECT COUNT(*) FROM t -- \udfff"}',
        "the query text is not valid Unicode (a lone surrogate, U+DFFF, at character 27)",
    ),
    "in a parameter": (
        r'{"sql": "SELECT COUNT(*) FROM t WHERE \u0027a\u0027 = $s", "params": {"s": "ab\ud800"}}',
        "parameter $s is not valid Unicode (a lone surrogate, U+D800, at character 3)",
    ),
    "in a list in a parameter": (
        r'{"sql": "SELECT COUNT(*) FROM t", "params": {"s": [1, ["\ud800"]]}}',
        "parameter $s is not valid Unicode",
    ),
    "in a parameter's name": (
        r'{"sql": "SELECT COUNT(*) FROM t", "params": {"\ud800": 1}}',
        "a parameter's name is not valid Unicode",
    ),
    "in the notebook's name": (
        r'{"sql": "SELECT COUNT(*) FROM t", "notebook": "hw\ud800.ipynb"}',
        "`notebook` is not valid Unicode (a lone surrogate, U+D800, at character 3)",
    ),
    "in the dataset's name": (
        r'{"sql": "SELECT COUNT(*) FROM t", "dataset": "\ud800"}',
        "`dataset` is not valid Unicode",
    ),
}


@pytest.mark.parametrize("where", SURROGATES)
def test_a_lone_surrogate_is_refused_where_the_body_is_read(
    where: str, unspent_engine: Engine
) -> None:
    engine = unspent_engine
    wire, said = SURROGATES[where]
    body = parse_body(wire.encode())  # valid JSON, valid UTF-8 on the wire
    with pytest.raises(InvalidBody) as refused:
        QueryRequest.from_body(body)
    assert refused.value.status == 400 and refused.value.kind == "bad_request"
    assert refused.value.message.startswith(said)
    assert refused.value.message.endswith("nothing was charged")
    # Through the engine: the same refusal, and nothing spent.
    with pytest.raises(InvalidBody, match="not valid Unicode"):
        engine.query("alice", {**body, "epsilon": 1.0})
    assert _spent(engine) == {"epsilon": 0.0, "delta": 0.0}


def test_text_outside_the_basic_plane_is_valid_unicode(engine: Engine) -> None:
    """A surrogate *pair* in JSON is one character (here 😀), which is fine."""
    wire = (
        r'{"sql": "SELECT COUNT(*) FROM t WHERE \u0027\ud83d\ude00\u0027 = $s", '
        r'"params": {"s": "\ud83d\ude00"}, "notebook": "\ud83d\ude00.ipynb"}'
    )
    body = parse_body(wire.encode())
    assert body["params"]["s"] == "😀"
    request = QueryRequest.from_body(body)
    assert request.notebook == "😀.ipynb"
    reply = engine.query("alice", {**body, "epsilon": 1.0})
    assert reply["cost"]["epsilon"] == 1.0
    assert json.dumps(reply)  # the reply encodes


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        ("SELECT COUNT(*) FROM t WHERE x = 1 AND", "AND has nothing after it at line 1, column 38"),
        ("SELECT COUNT(*) FROM t WHERE (", "a parenthesis has nothing in it"),
        ("SELECT COUNT(* FROM t", "Expecting ) at line 1, column 19, near 'FROM'"),
        ("SELECT 'abc FROM t", "a quote or comment is not closed"),
    ],
)
def test_a_parse_error_speaks_sql_not_python(sql: str, said: str) -> None:
    """sqlglot's messages name Python classes and tokens ("<class 'sqlglot.expressions
    .core.And'>"); the refusal says what is wrong in the query's own words and where."""
    with pytest.raises(Refused) as refused:
        parse(sql)
    message = str(refused.value)
    assert said in message
    assert "<class" not in message and "sqlglot" not in message and "Token(" not in message
