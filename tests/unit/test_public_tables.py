"""Public tables through the gate's request path: joined to private rows at no
extra cost, their values known group keys, never released raw."""

from __future__ import annotations

import pytest

from dpmagic.gate.failures import GateError
from tests.gate_helpers import running_engine

POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = { people = "people.csv", regions = "regions.csv" }
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = { epsilon = 1000.0 }
query_default = { epsilon = 100.0 }

[datasets.d.tables.people.columns]
pid = { type = "int" }
state = { type = "str" }
age = { type = "int", lower = 0, upper = 100 }

[datasets.d.tables.regions]
public = true
columns = { state = { type = "str" }, region = { type = "str" }, size = { type = "int" } }
"""
STATES = {"CA": "West", "OR": "West", "NY": "East", "MA": "East", "TX": "South"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    people = [(pid, list(STATES)[pid % 4], 20 + pid % 50) for pid in range(400)]
    regions = [(s, r, i) for i, (s, r) in enumerate(STATES.items())]
    tables = {"people": ("pid,state,age", people), "regions": ("state,region,size", regions)}
    with running_engine(tmp_path_factory.mktemp("public"), POLICY, tables) as e:
        yield e


def test_a_public_columns_values_are_the_group_keys(engine):
    reply = engine.query(
        "a",
        {
            "sql": "SELECT r.region, COUNT(*) AS n FROM people AS p "
            "JOIN regions AS r ON p.state = r.state GROUP BY r.region ORDER BY r.region",
            "fresh": True,
        },
    )
    # Every region of the public table is released, South too, which no one lives in.
    assert [row[0] for row in reply["rows"]] == ["East", "South", "West"]
    counts = {row[0]: row[1] for row in reply["rows"]}
    assert counts["East"] == pytest.approx(200, abs=5)
    assert counts["West"] == pytest.approx(200, abs=5)
    assert counts["South"] == pytest.approx(0, abs=5)
    schema = engine.schema(None)["tables"]["regions"]["columns"]
    assert schema["region"]["public_values"] == ["East", "South", "West"]


def test_a_public_table_alone_or_raw_is_refused(engine):
    for sql in (
        "SELECT COUNT(*) FROM regions",
        "SELECT r.state FROM people AS p JOIN regions AS r ON p.state = r.state",
    ):
        with pytest.raises(GateError) as info:
            engine.query("a", {"sql": sql})
        assert info.value.kind == "refused"
