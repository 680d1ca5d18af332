"""Per-query contribution bounds: an analyst may tighten, never loosen, the policy's
``max_partitions`` and ``max_rows_per_partition`` for one query (request fields, the
client's arguments, ``%%dpsql --max-groups/--max-rows``). The plan, the noise, the
dry run and the replay key follow; a bound above the policy's is refused, free."""

from __future__ import annotations

import pytest

from dpmagic.gate.failures import BadRequest
from dpmagic.magics.dpsql import parse_line
from tests.gate_helpers import running_engine

POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
max_partitions = 4
max_rows_per_partition = 4
user_budget = { epsilon = 1e6 }
notebook_budget = { epsilon = 1e6 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
g = { type = "int", public_values = [0, 1, 2] }
"""
SQL = "SELECT g, COUNT(*) AS n FROM t GROUP BY g"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    rows = [(p, p % 3) for p in range(300)]
    with running_engine(tmp_path_factory.mktemp("q"), POLICY, {"t": ("pid,g", rows)}) as e:
        yield e


def _noise(reply: dict) -> float:
    """The plan's noise scale of the query's one count, as the dry run shows it."""
    (m,) = [p for p in reply["plan"] if p["kind"] == "count"]
    return float(m["scale"])


def test_tighter_bounds_shrink_the_noise_at_the_same_cost(engine) -> None:
    ask = {"sql": SQL, "epsilon": 1.0, "dry_run": True}
    loose = engine.query("ann", ask)
    tight = engine.query("ann", {**ask, "max_partitions": 1, "max_rows_per_partition": 1})
    assert loose["cost"] == tight["cost"]
    # a unit reaches at most the 3 declared groups with 4 rows each, against 1 row
    assert _noise(loose) == pytest.approx(12 * _noise(tight))
    assert tight["bounding"]["rows_per_unit"] == 1
    assert tight["request"]["max_partitions"] == 1


def test_a_bound_above_the_policys_is_refused_free(engine) -> None:
    before = engine.budget("ann", "d", None)
    with pytest.raises(BadRequest, match="may only tighten the policy's bound: at most 4"):
        engine.query("ann", {"sql": SQL, "epsilon": 1.0, "max_partitions": 5})
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(BadRequest, match="whole number"):
            engine.query("ann", {"sql": SQL, "epsilon": 1.0, "max_rows_per_partition": bad})
    assert engine.budget("ann", "d", None) == before


def test_an_answer_under_other_bounds_is_not_replayed(engine) -> None:
    ask = {"sql": SQL, "epsilon": 0.5, "notebook": "replays"}
    first = engine.query("bea", ask)
    assert engine.query("bea", ask)["replayed"]
    tight = engine.query("bea", {**ask, "max_partitions": 1})
    assert (not tight["replayed"] and tight["rows"] != first["rows"]) or not tight["replayed"]
    assert engine.query("bea", {**ask, "max_partitions": 1})["replayed"]


def test_the_magic_takes_the_bounds() -> None:
    opts, sql = parse_line("--max-groups 1 --max-rows=2 -e 0.5 SELECT 1")
    assert (opts.max_groups, opts.max_rows, sql) == (1, 2, "SELECT 1")
    with pytest.raises(Exception, match="whole number"):
        parse_line("--max-groups 0 SELECT 1")
