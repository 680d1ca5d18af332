"""The query reply's one struct (``protocol.QueryReply``): every kind of reply the gate
makes reads back into it, field for field, over JSON and over Arrow; a key on one side
only fails; a reply kept by an older gate still replays."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import msgspec
import pytest

from dpmagic import wire
from dpmagic.client.errors import DPError, QueryRefused
from dpmagic.client.http_gate import _decode, _query_reply
from dpmagic.display.result import DPResult
from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import OverBudget, Refused
from dpmagic.gate.policy import load_policy
from dpmagic.gate.reply import Reply
from dpmagic.protocol import (
    REPLY_FIELDS,
    WIRE_VERSION,
    BudgetName,
    Clip,
    ClipRows,
    Cost,
    ErrorReply,
    LeftOut,
    QueryReply,
    default_delta,
    reply_of,
)
from tests import shop

ROOT = Path(__file__).resolve().parents[2] / "dpmagic"
PART = """
[datasets.shop.tables.part]
public = true
columns.p_partkey = { type = "int" }
columns.p_brand = { type = "str" }
"""
# Each kind of reply, as the shop's queries ask for them.
KINDS = {
    "count": {"sql": "SELECT COUNT(*) AS n FROM customer"},
    "grouped sum": {"sql": "SELECT o_priority, SUM(o_total) FROM orders GROUP BY o_priority"},
    "mean": {"sql": "SELECT AVG(c_acctbal) FROM customer"},
    "quantile": {"sql": "SELECT MEDIAN(c_acctbal) FROM customer"},
    "accuracy first": {"sql": "SELECT COUNT(*) FROM customer", "accuracy": 50.0},
    "bounding report": {"sql": "SELECT COUNT(*) FROM orders", "bounding_report": 0.2},
    "clipped": {"sql": "SELECT SUM(c_acctbal) FROM customer", "clip": 0.25},
    "clipped rows": {
        "sql": "SELECT o_priority, COUNT(*) FROM orders GROUP BY o_priority",
        "clip": 0.25,
    },
    "value first": {
        "sql": "SELECT COUNT(*) FROM customer WHERE c_acctbal > "
        "(SELECT AVG(c_acctbal) FROM customer)"
    },
    "table first": {
        "sql": "WITH rev AS (SELECT o_priority AS pr, SUM(o_total) AS total FROM orders "
        "GROUP BY o_priority) SELECT pr, total FROM rev WHERE total = (SELECT MAX(total) FROM rev)"
    },
    "per person": {
        "sql": "SELECT AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders "
        "GROUP BY o_custkey) AS p"
    },
    "dry run": {
        "sql": "SELECT o_priority, COUNT(*) FROM orders GROUP BY o_priority",
        "dry_run": True,
    },
    "exact public read": {"sql": "SELECT p_brand, COUNT(*) FROM part GROUP BY p_brand"},
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder = tmp_path_factory.mktemp("shop")
    shop.build(folder / "shop.duckdb")
    text = shop.policy_text(folder / "shop.duckdb", folder / "state")
    text = text.replace("\n[datasets.shop.tables.part]\npublic = true\n", PART)
    text = text.replace(
        "max_rows_per_partition = 8", "max_rows_per_partition = 8\npublic_tables_readable = true"
    )
    (folder / "policy.toml").write_text(text)
    e = Engine(load_policy(folder / "policy.toml"))
    yield e
    e.close()


def _ask(engine: Engine, body: dict, user: str = "alice") -> Reply:
    return engine.respond(user, {"notebook": "nb", **body})


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_reply_reads_back_into_the_struct(engine: Engine, kind: str) -> None:
    reply = _ask(engine, KINDS[kind])
    sent = reply.json()
    # Strict: a key the gate sent that the struct has no field for raises here.
    read = reply_of(sent)
    assert read.json() == sent  # every field round-trips
    assert sent["version"] == WIRE_VERSION
    # Over Arrow: the envelope reads into the struct, and the result shows the same.
    envelope, cells = wire.read(reply.arrow())
    assert reply_of(envelope).json() == envelope
    assert DPResult(reply_of(envelope), cells=cells).reply == DPResult(sent).reply == sent


def test_the_kinds_say_what_they_are(engine: Engine) -> None:
    """Each kind's typed facts are where the client reads them."""
    replies = {kind: reply_of(_ask(engine, body).json()) for kind, body in KINDS.items()}
    assert replies["exact public read"].exact is not None
    assert replies["exact public read"].cost == Cost(epsilon=0.0, delta=0.0)
    assert replies["dry run"].dry_run and replies["dry run"].rows == []
    clip = replies["clipped"].clip
    assert clip is not None and clip.chosen and clip.chosen[0].source in ("data", "declared")
    rows = (replies["clipped rows"].clip or Clip(0, 0, "", [])).rows
    assert isinstance(rows, ClipRows) and rows.source in ("data", "declared") and rows.declared == 8
    [stage] = replies["value first"].stages or []
    assert stage.released and isinstance(stage.value, float) and stage.rows is None
    [table] = replies["table first"].stages or []
    assert table.table == "rev" and table.rows is not None
    assert replies["table first"].post_processed is not None
    bounding = replies["bounding report"].bounding
    assert bounding is not None and isinstance(bounding.left_out, LeftOut)
    assert replies["accuracy first"].request is not None
    assert replies["accuracy first"].request.accuracy == 50.0
    assert replies["per person"].per_person
    again = reply_of(_ask(engine, KINDS["count"]).json())
    assert again.replayed and again.cost == Cost(epsilon=0.0, delta=0.0)


def test_a_refusal_reads_into_the_error_struct(engine: Engine) -> None:
    with pytest.raises(Refused) as refused:
        _ask(engine, {"sql": "SELECT c_acctbal FROM customer"})
    body = json.loads(json.dumps(refused.value.as_reply()))
    error = msgspec.convert(body, ErrorReply).error
    assert error.kind == "refused" and error.message == refused.value.message
    over = OverBudget("no more", BudgetName(budget="dataset", dataset="shop"))
    sent = json.loads(json.dumps(over.as_reply()))
    assert sent["error"]["budget"] == {"budget": "dataset", "dataset": "shop"}
    assert msgspec.convert(sent, ErrorReply).error.budget == BudgetName(
        budget="dataset", dataset="shop"
    )


def test_a_key_on_one_side_only_fails() -> None:
    """A key the gate sends without a field in the struct is refused where the reply is
    read; a field the gate fills in that no client code reads, or one the client reads
    that the gate never fills in, fails the static check below."""
    with pytest.raises(msgspec.ValidationError, match="unknown field `brand_new`"):
        reply_of({"dataset": "d", "brand_new": 1})
    with pytest.raises(TypeError):
        QueryReply(brand_new=1)  # type: ignore[call-arg]


# Fields not read by name on the client: the version (``reply_of`` reads it from the
# JSON), the echo of the request (matched by transcripts as the gate stored it),
# ``rows`` (read through ``wire``'s columns or the envelope, by name below).
NOT_READ = {"version", "request"}
# Fields left at their default by the gate's code and set only by the client side's.
CLIENT_ONLY = {"mock", "offline"}


def _source(*paths: str) -> str:
    return "\n".join((ROOT / p).read_text() for p in paths)


def test_every_field_is_filled_in_by_the_gate_and_read_by_the_client() -> None:
    gate = "\n".join(p.read_text() for p in (ROOT / "gate").rglob("*.py"))
    client = _source(
        "display/result.py", "client/http_gate.py", "client/transcript.py", "client/mock.py"
    )
    for field in REPLY_FIELDS - {"version"}:
        made = rf"\b{field}=|\.{field} = |\.{field}, "
        if field in CLIENT_ONLY:
            assert re.search(made, client), f"{field}: no client code fills it in"
        else:
            assert re.search(made, gate), f"{field}: the gate never fills it in"
        if field not in NOT_READ:
            assert re.search(rf"\.{field}\b", _source("display/result.py")), f"{field}: never read"


def test_the_client_says_a_body_is_not_a_reply() -> None:
    with pytest.raises(DPError, match="not a query's reply"):
        _query_reply({"dataset": "d", "rows": 3, "cost": "free"})
    with pytest.raises(DPError, match="HTTP 502"):
        _decode(502, b"<html>bad gateway</html>")
    with pytest.raises(QueryRefused, match="no"):
        _decode(400, json.dumps({"error": {"kind": "refused", "message": "no"}}).encode())


def test_a_reply_kept_by_an_older_gate_replays() -> None:
    """An envelope of a key since retired and without a version reads as this version's."""
    old = {"dataset": "d", "columns": ["n"], "rows": [[3]], "retired": {"x": 1},
           "cost": {"epsilon": 0.5, "delta": 0.0}, "replayed": False, "dry_run": False}  # fmt: skip
    envelope, table = wire.split(old)
    stored = Reply.stored(wire.write(envelope, table))
    assert stored.envelope.version == WIRE_VERSION and stored.json()["rows"] == [[3]]
    assert "retired" not in stored.json()
    assert Reply.stored(json.dumps(old)).json()["rows"] == [[3]]  # a JSON ledger's too
    with pytest.raises(msgspec.ValidationError):
        reply_of(old)  # read as a live reply, the retired key is an error


def test_a_release_kept_by_an_older_gate_replays_from_the_ledger(engine: Engine) -> None:
    """A release whose kept envelope has no version and a key since retired (as an older
    gate wrote it) is replayed by this one, free, and reads as this version's reply."""
    body = {"sql": "SELECT COUNT(*) AS kept FROM orders", "notebook": "older"}
    first = _ask(engine, body).json()
    path = engine.policy.gate.state_dir / "ledger.sqlite3"
    with closing(sqlite3.connect(path)) as con, con:
        (entry, stream) = con.execute(
            "SELECT id, reply FROM entries WHERE sql LIKE '%kept%' AND status = 'released'"
        ).fetchone()
        envelope, _ = wire.read(stream)
        envelope.pop("version")
        envelope["retired"] = {"said": "once"}
        older = wire.restamp(stream, envelope)
        con.execute("UPDATE entries SET reply = ? WHERE id = ?", (older, entry))
    again = _ask(engine, body)
    sent = again.json()
    assert sent["replayed"] and sent["version"] == WIRE_VERSION and "retired" not in sent
    assert sent["rows"] == first["rows"] and again.envelope.cost == Cost(epsilon=0, delta=0)
    assert reply_of(sent).json() == sent


def test_a_newer_gates_reply_is_read_for_what_this_version_knows() -> None:
    newer = {"version": WIRE_VERSION + 1, "dataset": "d", "later": True}
    assert reply_of(newer).dataset == "d"
    with pytest.raises(msgspec.ValidationError):  # not a version: not read as one
        reply_of({"version": "2", "dataset": "d"})


@pytest.mark.parametrize(
    ("query_delta", "zcdp", "notebook", "expected"),
    [(1e-6, False, 1e-5, 1e-6), (0.0, False, 1e-5, 0.0), (0.0, True, 1e-5, 1e-5),
     (1e-7, True, 1e-5, 1e-7)],
)  # fmt: skip
def test_the_default_delta_rule(
    query_delta: float, zcdp: bool, notebook: float, expected: float
) -> None:
    assert default_delta(query_delta, zcdp, notebook) == expected
