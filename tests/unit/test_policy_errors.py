"""A bad policy is refused by a :class:`PolicyError` that names the key's full path
(``datasets.d.tables.t.columns.age.lower``), at every depth of the file, and whose
words come from the policy, not from the value at fault."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from dpmagic.gate.policy import PolicyError, load_policy, parse_policy

# What the value at fault is set to, where a test must not find it in the message.
ODD = "zz-odd-value"
GONE = object()  # the key is removed


def _valid() -> dict:
    return {
        "gate": {"state_dir": "state", "threads": 2},
        "datasets": {
            "d": {
                "sources": {"t": "t.csv"},
                "privacy_unit": "pid",
                "user_budget": {"epsilon": 1.0},
                "tables": {
                    "t": {
                        "columns": {
                            "pid": {"type": "int"},
                            "age": {"type": "int", "lower": 0, "upper": 100},
                            "s": {
                                "type": "int",
                                "public_values": [0, 1],
                                "randomized_response": {"p": 0.75},
                            },
                        }
                    }
                },
                "engine": "spark",
                "spark": {"master": "local[2]", "conf": {"ui": False}},
            }
        },
    }


def _with(path: str, value: object) -> dict:
    raw = _valid()
    *parents, key = path.split(".")
    at = raw
    for part in parents:
        at = at[part]
    if value is GONE:
        del at[key]
    else:
        at[key] = value
    return raw


COLUMNS = "datasets.d.tables.t.columns"

# (the key to set, its value, what the message must say: the full path first)
CASES = [
    # wrong type
    ("gate.threads", ODD, "gate.threads must be a whole number"),
    ("gate.state_dir", 3, "gate.state_dir must be a string"),
    ("datasets.d.max_partitions", 2.5, "datasets.d.max_partitions must be a whole number"),
    ("datasets.d.user_budget", ODD, "datasets.d.user_budget must be a table such as"),
    ("datasets.d.user_budget.epsilon", ODD, "datasets.d.user_budget.epsilon must be a number"),
    ("datasets.d.tables.t", ODD, "datasets.d.tables.t must be a table"),
    ("datasets.d.tables.t.public", ODD, "datasets.d.tables.t.public must be true or false"),
    (f"{COLUMNS}.age", ODD, f'{COLUMNS}.age must be a table such as {{ type = "int" }}'),
    (f"{COLUMNS}.age.lower", ODD, f"{COLUMNS}.age.lower must be a finite number"),
    (f"{COLUMNS}.s.randomized_response.p", ODD, f"{COLUMNS}.s.randomized_response.p must be"),
    ("datasets.d.spark.master", 1, "datasets.d.spark.master must be a string"),
    ("datasets.d.spark.conf.ui", [1], "datasets.d.spark.conf.ui must be a string, number or"),
    ("datasets.d.sources.t", 1, "datasets.d.sources.t must be a file, a folder or table:NAME"),
    # a choice not among those known
    ("gate.accountant", ODD, "gate.accountant must be one of pure, approx, zcdp"),
    ("datasets.d.neighbouring", ODD, "datasets.d.neighbouring must be one of add_remove"),
    (f"{COLUMNS}.age.type", ODD, f"{COLUMNS}.age.type must be one of int, float, str"),
    # unknown key
    ("colour", 1, "the policy: unknown key 'colour'"),
    ("gate.port", 1, "gate: unknown key 'port'"),
    ("datasets.d.budget", 1, "datasets.d: unknown key 'budget'"),
    ("datasets.d.user_budget.epsilonn", 1, "datasets.d.user_budget: unknown key 'epsilonn'"),
    ("datasets.d.tables.t.colums", {}, "datasets.d.tables.t: unknown key 'colums'"),
    (f"{COLUMNS}.age.uper", 1, f"{COLUMNS}.age: unknown key 'uper'"),
    (f"{COLUMNS}.s.randomized_response.q", 1, f"{COLUMNS}.s.randomized_response: unknown key"),
    ("datasets.d.spark.port", 1, "datasets.d.spark: unknown key 'port'"),
    # a required key missing
    ("datasets", GONE, "datasets is required"),
    ("datasets.d.user_budget", GONE, "datasets.d.user_budget is required, e.g. {"),
    ("datasets.d.user_budget.epsilon", GONE, "datasets.d.user_budget.epsilon is required"),
    ("datasets.d.tables", GONE, "datasets.d.tables is required"),
    (f"{COLUMNS}.age.type", GONE, f"{COLUMNS}.age.type is required: one of int, float"),
    (f"{COLUMNS}.s.randomized_response.p", GONE, f"{COLUMNS}.s.randomized_response.p must be"),
    # out of range
    ("gate.threads", 0, "gate.threads must be at least 1"),
    ("gate.workers", 0, "gate.workers must be at least 1"),
    ("gate.response_quantum_ms", -1, "gate.response_quantum_ms must be at least 0"),
    ("gate.query_timeout_s", float("inf"), "gate.query_timeout_s must be a finite number"),
    ("datasets.d.user_budget.epsilon", -0.5, "datasets.d.user_budget.epsilon must be at least 0"),
    ("datasets.d.user_budget.delta", 1, "datasets.d.user_budget.delta must be below 1"),
    ("datasets.d.group_size", 0, "datasets.d.group_size must be at least 1"),
    ("datasets.d.tables.t.max_rows_per_unit", 0, "t.max_rows_per_unit must be at least 1"),
    (f"{COLUMNS}.age.lower", float("nan"), f"{COLUMNS}.age.lower must be a finite number"),
    (f"{COLUMNS}.s.randomized_response.p", 1.5, "randomized_response.p must be a number in (0, 1]"),
    (f"{COLUMNS}.s.public_values", [], f"{COLUMNS}.s.public_values must be a non-empty list"),
    ("datasets.d.spark.master", "", "datasets.d.spark.master must be a non-empty string"),
    # keys that depend on others
    (f"{COLUMNS}.age.upper", -1, f"{COLUMNS}.age: lower (0) is above upper (-1)"),
    (f"{COLUMNS}.age.max_length", 5, f"{COLUMNS}.age.max_length applies to str columns only"),
    ("datasets.d.tables.t.unit", "nobody", "datasets.d.tables.t.unit must name one of the"),
    ("datasets.d.sources.u", "u.csv", "datasets.d.sources.u: no such table is declared"),
    # a Spark session is one process's: several workers serve DuckDB datasets only
    ("gate.workers", 2, "gate.workers = 2 serves DuckDB datasets only; 'd' runs on Spark"),
]


@pytest.mark.parametrize(("key", "value", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_key_is_refused_by_its_full_path(key: str, value: object, message: str) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy(_with(key, value), Path("p.toml"))
    assert message in str(refused.value)
    assert ODD not in str(refused.value)


def test_the_valid_policy_of_these_cases_parses() -> None:
    assert parse_policy(_valid(), Path("p.toml")).dataset("d").tables["t"].unit == "pid"


def test_workers_are_one_unless_set_and_serve_duckdb_datasets() -> None:
    raw = _valid()
    del raw["datasets"]["d"]["engine"], raw["datasets"]["d"]["spark"]
    assert parse_policy(raw, Path("p.toml")).gate.workers == 1
    raw["gate"]["workers"] = 4
    assert parse_policy(raw, Path("p.toml")).gate.workers == 4


def test_a_policy_error_is_a_value_error_and_the_parse_changes_nothing() -> None:
    raw = _with("gate.threads", 0)
    before = copy.deepcopy(raw)
    with pytest.raises(ValueError, match=r"gate\.threads"):
        parse_policy(raw, Path("p.toml"))
    assert raw == before


def test_a_file_error_names_the_key_too(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[gate]\nthreads = 0\n[datasets.d]\n")
    with pytest.raises(PolicyError, match=r"gate\.threads must be at least 1"):
        load_policy(path)
    path.write_text("[gate\n")
    with pytest.raises(PolicyError, match=r"p\.toml: not valid TOML"):
        load_policy(path)
