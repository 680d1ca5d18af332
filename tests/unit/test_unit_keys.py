"""Group keys a unit's rows all share (``sql/unit_keys.py``): the window then keeps one
group a unit, which loses no row, and a unit's reach stays within the window's bound
whatever the rule says.

Three checks: which keys the rule calls fixed (shapes either way), that one group a
unit keeps exactly the rows the policy's groups kept (searched over generated shops
and the fixed shapes), and that removing any one customer moves the exact answer by
at most the plan's sensitivity, shown to catch a window that does not hold its
group bound when the rule is wrong.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import Dataset, load_policy
from dpmagic.gate.sql import ranks, unit_keys
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.resolve import resolve
from tests import shop
from tests.gate_helpers import exact_vectors, insert_rows, make_plan, run_exact

# Public tables beside the shop: one keyed by its segment (a unique column), one with
# two rows a segment.
PUBLIC = """
[datasets.shop.tables.segments]
public = true
columns.s_segment = { type = "str" }
columns.s_market = { type = "str" }

[datasets.shop.tables.tags]
public = true
columns.t_segment = { type = "str" }
columns.t_tag = { type = "str" }
"""
LINES = (
    "FROM lineitem JOIN orders ON l_orderkey = o_orderkey JOIN customer ON o_custkey = c_custkey "
)
FIXED = [
    f"SELECT c_segment, SUM(l_quantity) AS q {LINES}GROUP BY c_segment",
    f"SELECT s_market, COUNT(*) AS n {LINES}JOIN segments ON s_segment = c_segment "
    "GROUP BY s_market",
    f"SELECT s_market, SUM(l_price) AS p {LINES}LEFT JOIN segments ON s_segment = c_segment "
    "GROUP BY s_market",
    "SELECT o_priority, COUNT(*) AS n FROM orders WHERE o_priority = '1-URGENT' "
    "GROUP BY o_priority",
    "SELECT c_segment, COUNT(*) AS n FROM orders JOIN customer ON o_custkey = c_custkey "
    "GROUP BY c_segment",
]
NOT_FIXED = [
    f"SELECT l_flag, COUNT(*) AS n {LINES}GROUP BY l_flag",
    "SELECT o_priority, COUNT(*) AS n FROM orders GROUP BY o_priority",
    f"SELECT t_tag, COUNT(*) AS n {LINES}JOIN tags ON t_segment = c_segment GROUP BY t_tag",
    f"SELECT s_market, COUNT(*) AS n {LINES}JOIN segments "
    "ON (s_segment = c_segment OR s_segment = 'AUTOMOBILE') GROUP BY s_market",
    f"SELECT c_segment, l_flag, COUNT(*) AS n {LINES}GROUP BY c_segment, l_flag",
]


def _build(folder: Path, customers: int = 60, seed: int = 7) -> Path:
    """The shop with its two public tables, and its policy with them declared."""
    database = folder / "shop.duckdb"
    shop.build(database, customers=customers, seed=seed)
    con = duckdb.connect(str(database))
    con.execute("CREATE TABLE segments (s_segment VARCHAR, s_market VARCHAR)")
    con.execute("CREATE TABLE tags (t_segment VARCHAR, t_tag VARCHAR)")
    insert_rows(con, "segments", [(s, f"market {i}") for i, s in enumerate(shop.SEGMENTS)])
    tags = [(s, f"tag {i % k}") for i, s in enumerate(shop.SEGMENTS) for k in (2, 3)]
    insert_rows(con, "tags", tags)
    con.close()
    policy = folder / "shop.toml"
    policy.write_text(shop.policy_text(database, folder / "state") + PUBLIC)
    return policy


def _served_dataset(policy: Path) -> Dataset:
    """The shop's dataset as a gate serves it: with the public facts it reads at start."""
    engine = Engine(load_policy(policy))
    try:
        return engine.policy.datasets["shop"]
    finally:
        engine.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Dataset, Path]]:
    """The shop's dataset with the public facts a gate reads at start, and its file."""
    folder = tmp_path_factory.mktemp("shop")
    engine = Engine(load_policy(_build(folder)))
    try:
        yield engine.policy.datasets["shop"], folder / "shop.duckdb"
    finally:
        engine.close()


def _fixed(sql: str, dataset: Dataset) -> bool:
    from dpmagic.gate.sql.check import check

    checked = check(resolve(parse(sql), dataset))
    return unit_keys.keys_fixed_by_unit(checked.resolved, [k.expr for k in checked.keys])


@pytest.mark.parametrize("sql", FIXED)
def test_keys_a_unit_holds_one_value_of_are_fixed_and_keep_one_group(served, sql):
    dataset, _ = served
    assert _fixed(sql, dataset)
    assert make_plan(sql, dataset).contribution.groups == 1


@pytest.mark.parametrize("sql", NOT_FIXED)
def test_keys_a_unit_may_hold_several_values_of_are_not(served, sql, monkeypatch):
    dataset, _ = served
    assert not _fixed(sql, dataset)
    c = make_plan(sql, dataset).contribution
    _as_before(monkeypatch)
    assert c == make_plan(sql, dataset).contribution


def test_one_group_a_unit_cuts_the_noise_of_a_sum_by_the_customers_nation(served, monkeypatch):
    """By four, the groups the policy lets a customer reach (of five markets): the
    q5 shape, a public table's rows reached by their key from the customer's row."""
    dataset, _ = served
    sql = FIXED[2]
    one = make_plan(sql, dataset).measurements[0].sensitivity
    _as_before(monkeypatch)
    four = make_plan(sql, dataset).measurements[0].sensitivity
    assert four == pytest.approx(dataset.max_partitions * one)


def _copy(database: Path, folder: Path) -> duckdb.DuckDBPyConnection:
    """A writable copy of the owner's file, for the rewritten SQL's prepared tables."""
    target = folder / f"run-{random.random():.12f}.duckdb"
    shutil.copy(database, target)
    return duckdb.connect(str(target))


def _vectors(sql: str, dataset: Dataset, database: Path, folder: Path, seed: int) -> dict:
    """Each measurement's exact vector, in its noise's units (which follow the plan)."""
    con = _copy(database, folder)
    try:
        return exact_vectors(make_plan(sql, dataset), con, seed)
    finally:
        con.close()


def _kept(sql: str, dataset: Dataset, database: Path, folder: Path, seed: int) -> list:
    """The rows the bounds keep in each group: the query's exact rows with its sums
    counted instead (a sum's exact value is in its noise's units, which follow the
    plan's sensitivity; a count's are rows)."""
    counted = re.sub(r"SUM\([^)]*\)", "COUNT(*)", sql)
    con = _copy(database, folder)
    try:
        return sorted(run_exact(make_plan(counted, dataset), con, seed).rows)
    finally:
        con.close()


def _as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window as it was before the rule: the policy's groups for every key."""
    monkeypatch.setattr(ranks, "keys_fixed_by_unit", lambda *_: False)


@pytest.mark.search
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(customers=st.integers(5, 40), data_seed=st.integers(0, 10**6), seed=st.integers(0, 99))
def test_one_group_a_unit_keeps_every_row_the_policys_groups_kept(
    tmp_path_factory, customers, data_seed, seed
):
    folder = tmp_path_factory.mktemp("search")
    dataset = _served_dataset(_build(folder, customers=customers, seed=data_seed))
    database = folder / "shop.duckdb"
    for sql in FIXED:
        now = _kept(sql, dataset, database, folder, seed)
        with pytest.MonkeyPatch.context() as patch:
            _as_before(patch)
            before = _kept(sql, dataset, database, folder, seed)
        assert now == before, sql


def test_one_group_a_unit_keeps_every_row_on_the_shop(served, tmp_path, monkeypatch):
    """The search's cheap case, in the default run."""
    dataset, database = served
    for sql in FIXED[1:3]:
        now = _kept(sql, dataset, database, tmp_path, seed=3)
        with monkeypatch.context() as patch:
            _as_before(patch)
            assert now == _kept(sql, dataset, database, tmp_path, seed=3), sql


def _largest_move(sql: str, dataset: Dataset, database: Path, folder: Path) -> tuple[float, float]:
    """The most the exact answer moves (in L1 over its cells) when one customer and all
    their orders and lines are removed, over every customer; and the sensitivity the
    plan noises it with."""
    p = make_plan(sql, dataset)
    (m,) = p.measurements
    whole = _vectors(sql, dataset, database, folder, seed=5)[m.name]
    con = duckdb.connect(str(database), read_only=True)
    customers = [c for (c,) in con.execute("SELECT c_custkey FROM customer").fetchall()]
    con.close()
    most = 0.0
    for c in customers:
        con = _copy(database, folder)
        try:
            con.execute(
                "DELETE FROM lineitem WHERE l_orderkey IN "
                f"(SELECT o_orderkey FROM orders WHERE o_custkey = {c})"
            )
            con.execute(f"DELETE FROM orders WHERE o_custkey = {c}")
            con.execute(f"DELETE FROM customer WHERE c_custkey = {c}")
            without = exact_vectors(p, con, seed=5)[m.name]
        finally:
            con.close()
        most = max(most, sum(abs(a - b) for a, b in zip(whole, without, strict=True)))
    return most, m.sensitivity


# A key no unit holds one value of (a line's flag), wrongly called fixed.
WRONG = f"SELECT l_flag, SUM(l_quantity) AS q {LINES}GROUP BY l_flag"


def test_a_rule_that_calls_a_lines_flag_fixed_is_caught_losing_rows(served, tmp_path, monkeypatch):
    """The broken rule: the comparison the search makes sees the rows it drops."""
    dataset, database = served
    before = _kept(WRONG, dataset, database, tmp_path, seed=3)
    monkeypatch.setattr(ranks, "keys_fixed_by_unit", lambda *_: True)
    assert _kept(WRONG, dataset, database, tmp_path, seed=3) != before


def test_a_key_wrongly_called_fixed_still_moves_within_the_sensitivity(tmp_path, monkeypatch):
    dataset = _served_dataset(_build(tmp_path, customers=6, seed=11))
    monkeypatch.setattr(ranks, "keys_fixed_by_unit", lambda *_: True)
    most, sensitivity = _largest_move(WRONG, dataset, tmp_path / "shop.duckdb", tmp_path)
    assert 0 < most <= sensitivity


def test_a_window_that_does_not_hold_its_groups_is_caught(tmp_path, monkeypatch):
    """The broken version: the rule wrong and the window's group bound not applied
    (``__group <= 1`` read as ``<= 3``): one customer's lines of three flags move the
    answer by more than the sensitivity of one group."""
    from dpmagic.gate.sql import rewrite

    dataset = _served_dataset(_build(tmp_path, customers=6, seed=11))
    monkeypatch.setattr(ranks, "keys_fixed_by_unit", lambda *_: True)
    bounded = rewrite.bound_contributions

    def loose(c, *args, **kwargs):
        return bounded(replace(c, groups=3), *args, **kwargs)

    monkeypatch.setattr(rewrite, "bound_contributions", loose)
    most, sensitivity = _largest_move(WRONG, dataset, tmp_path / "shop.duckdb", tmp_path)
    assert most > sensitivity
