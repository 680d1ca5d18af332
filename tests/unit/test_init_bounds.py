"""``dpmagic init`` for data where each row is a person (``--row-level``), and each
bound it writes commented with what it costs (a count's 95% error at ε = 1, the
gate's own figure); ``/v1/schema`` sends the same figures for ``%dpschema``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpmagic.commands.init_policy import write_skeleton
from dpmagic.gate.engine import count_error, count_error_of
from dpmagic.gate.policy import load_policy


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "people.parquet"
    import duckdb

    duckdb.sql(
        f"COPY (SELECT range AS id, range % 7 AS age FROM range(20)) TO '{path}' (FORMAT parquet)"
    )
    return path


def _bounds(text: str) -> dict[str, tuple[int, int]]:
    """Each ``key = value  # … ±E`` line's value and stated error."""
    found = re.findall(r"^(\w+) = (\d+) +#.*±(\d+)$", text, re.MULTILINE)
    return {k: (int(v), int(e)) for k, v, e in found}


def test_each_bound_says_what_a_count_costs(data: Path, tmp_path: Path) -> None:
    out = write_skeleton([data], "id", tmp_path / "p.toml")
    bounds = _bounds(out.read_text())
    assert bounds["max_partitions"] == (4, count_error_of(16)) == (4, 48)
    assert bounds["max_rows_per_partition"] == (4, count_error_of(4)) == (4, 12)


def test_row_level_with_a_unit_declares_a_row_per_person(data: Path, tmp_path: Path) -> None:
    out = write_skeleton([data], "id", tmp_path / "p.toml", row_level=True)
    policy = load_policy(out)
    table = policy.dataset(None).tables["people"]
    assert table.max_rows == 1
    assert _bounds(out.read_text())["max_rows_per_unit"] == (1, 3)
    # the schema the gate serves says the same
    assert count_error(policy.dataset(None))["tables"]["people"] == {"ungrouped": 3, "grouped": 3}


def test_row_level_without_a_unit_makes_each_row_its_own(data: Path, tmp_path: Path) -> None:
    out = write_skeleton([data], None, tmp_path / "p.toml", row_level=True)
    ds = load_policy(out).dataset(None)
    assert ds.privacy_unit is None
    assert count_error(ds)["grouped"] == 3


def test_without_a_unit_or_row_level_init_asks_for_one(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--row-level if each row is a person"):
        write_skeleton([data], None, tmp_path / "p.toml")
