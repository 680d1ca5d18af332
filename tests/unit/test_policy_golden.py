"""Every policy the project ships or writes parses to the values recorded in
``fixtures/policy_golden/``: the bundled example, the golden suite's policies,
``every_key.toml`` (every key the file knows) and the skeletons ``dpmagic init``
writes. The recorded values came from the parser before the schema library's, so a
change of parser that changes a parsed value (a type, a default, a lower-cased name)
fails here.

``python -m tests.unit.test_policy_golden`` rewrites the fixtures, for a change to
the policy's values that is meant.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import duckdb

from dpmagic.commands.demo import example_file
from dpmagic.commands.init_policy import Answers, plan, read_data, skeleton
from dpmagic.gate.policy import Policy, parse_policy

FIXTURES = Path(__file__).parent / "fixtures" / "policy_golden"
GOLDEN_POLICIES = Path(__file__).parents[1] / "golden" / "policies"
# Parsed as if the file lived here, so the recorded paths do not depend on the checkout.
WHERE = Path("/policy/policy.toml")

# (fixture name, files, privacy unit, row level) for ``dpmagic init``'s skeletons.
SKELETONS = [
    ("init_csv", ["visits.csv"], "pid", False),
    ("init_parquet", ["typed.parquet"], "pid", False),
    ("init_two_files_row_level", ["visits.csv", "typed.parquet"], "pid", True),
    ("init_no_unit", ["visits.csv"], None, True),
]


def plain(value: object) -> object:
    """``value`` as JSON that keeps what equality would blur: the class of each
    dataclass, tuples apart from lists, ints apart from floats, paths, dates, enums."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__class__": type(value).__name__, **fields}
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__name__}.{value.name}"}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {"__tuple__": [plain(v) for v in value]}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return {"__path__": str(value)}
    if isinstance(value, dt.date):
        return {"__date__": value.isoformat()}
    return value


def snapshot(policy: Policy) -> str:
    return json.dumps(plain(policy), indent=1, ensure_ascii=False) + "\n"


def _data(folder: Path) -> None:
    """The files the skeletons are written from: a CSV (no declared types) and a
    Parquet file with every type the policy knows, one it does not (a list)."""
    (folder / "visits.csv").write_text("pid,Age,name\n1,41,a\n")
    con = duckdb.connect()
    try:
        con.execute(
            "COPY (SELECT 1::BIGINT AS pid, 2::SMALLINT AS small, 1.5::DOUBLE AS x, "
            "1.5::DECIMAL(9, 2) AS price, TRUE AS flag, DATE '2020-01-01' AS day, "
            "'a' AS label, [1] AS list) TO ? (FORMAT parquet)",
            [str(folder / "typed.parquet")],
        )
    finally:
        con.close()


def policies(folder: Path) -> Iterator[tuple[str, Policy]]:
    """(fixture name, parsed policy) for each policy the golden test covers."""
    texts = {
        "examples_clinic": example_file("clinic.toml").read_text(),
        "examples_tpch": example_file("tpch.toml").read_text(),
    }
    for path in sorted(GOLDEN_POLICIES.glob("*.toml")):
        texts[f"golden_{path.stem}"] = path.read_text()
    texts["every_key"] = (FIXTURES / "every_key.toml").read_text()
    _data(folder)
    for name, files, unit, row_level in SKELETONS:
        out = folder / "policy.toml"
        data = read_data([folder / f for f in files])
        settled = plan(data, unit, Answers(yes=True, row_level=row_level))
        texts[name] = skeleton(settled, "data", out)
    for name, text in texts.items():
        yield name, parse_policy(tomllib.loads(text), WHERE)


def test_every_shipped_and_written_policy_parses_to_its_recorded_values(tmp_path: Path) -> None:
    seen = []
    for name, policy in policies(tmp_path):
        assert snapshot(policy) == (FIXTURES / f"{name}.json").read_text(), name
        seen.append(name)
    assert len(seen) == len(list(FIXTURES.glob("*.json")))


def test_the_fixtures_cover_every_example_policy() -> None:
    shipped = {p.name for p in example_file("clinic.toml").parent.glob("*.toml")}
    assert shipped == {"clinic.toml", "tpch.toml"}, "add the new example policy to policies()"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for name, policy in policies(Path(folder)):
            (FIXTURES / f"{name}.json").write_text(snapshot(policy))
