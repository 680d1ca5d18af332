"""The shared query corpora over PUMS: refusals cost nothing and leak nothing;
every accepted query is answered with noisy aggregates at the asked cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmagic.gate.failures import GateError
from tests.gate_helpers import running_engine

SHARED = Path(__file__).resolve().parents[3] / "shared"
pytestmark = pytest.mark.skipif(
    not (SHARED / "corpus").is_dir(), reason="../shared (data and query corpora) is absent"
)


def _lines(name: str) -> list[str]:
    return [s for s in (SHARED / "corpus" / name).read_text().splitlines() if s.strip()]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pums")
    public = {
        "sex": [0, 1],
        "educ": list(range(1, 17)),
        "race": list(range(1, 7)),
        "married": [0, 1],
    }
    columns = "\n".join(
        [
            'pid = { type = "int" }',
            'age = { type = "int", lower = 0, upper = 100 }',
            'income = { type = "float", lower = 0, upper = 500000 }',
            *(
                f'{c} = {{ type = "int", public_values = {json.dumps(v)} }}'
                for c, v in public.items()
            ),
        ]
    )
    policy = f"""
[gate]
state_dir = "state"

[datasets.pums]
sources = {{ pums = "{(SHARED / "data" / "PUMS_dup.csv").as_posix()}" }}
privacy_unit = "pid"
max_partitions = 4
max_rows_per_partition = 4
user_budget = {{ epsilon = 1000.0 }}
notebook_budget = {{ epsilon = 1000.0 }}
query_default = {{ epsilon = 1.0 }}

[datasets.pums.tables.pums.columns]
{columns}
"""
    with running_engine(folder, policy) as e:
        yield e


@pytest.mark.parametrize("sql", _lines("refuse.sql") if SHARED.is_dir() else [])
def test_refused_before_touching_data_with_nothing_charged(engine, sql):
    with pytest.raises(GateError) as info:
        engine.query("mallory", {"sql": sql, "notebook": "attack"})
    err = info.value
    assert err.kind == "refused"
    assert "\n" not in err.message and 0 < len(err.message) < 300
    spent = engine.budget("mallory", None, "attack")["user"]["spent"]
    assert spent == {"epsilon": 0.0, "delta": 0.0}


@pytest.mark.parametrize("sql", _lines("accept.sql") if SHARED.is_dir() else [])
def test_accepted_queries_are_answered(engine, sql):
    body = {"sql": sql, "notebook": "corpus", "fresh": True}
    reply = engine.query("analyst", body)
    assert reply["rows"], sql
    assert reply["cost"]["epsilon"] == 1.0
    assert len(reply["columns"]) == len(reply["rows"][0])
    numeric = [i for i, c in enumerate(reply["accuracy"]["columns"]) if c is not None]
    assert numeric, "every answer releases at least one noisy column"
