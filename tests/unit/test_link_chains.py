"""Links along keys: a table reaches its person through another table's unique key
(``lineitem → orders → customer``). The policy settles the chain, the preparation
reads each row's unit along it (checked here against the join written by hand), a
key that is not unique refuses the start without naming a value, and a join along a
link is answered as a join on the unit, with the unit equality the gate adds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from sqlglot import exp

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError
from dpmagic.gate.policy import DERIVED_UNIT, PolicyError, Via, load_policy
from dpmagic.gate.sql import resolve as resolve_module
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.resolve import resolve
from tests import shop

EPSILON = 1e4  # little noise: answers land near the bounded truth


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shop")
    shop.build(out / "shop.duckdb")
    (out / "shop.toml").write_text(shop.policy_text(out / "shop.duckdb", out / "state"))
    return out


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[Engine]:
    e = Engine(load_policy(folder / "shop.toml"))
    yield e
    e.close()


def _policy(folder: Path, edit: tuple[str, str] | None = None):
    text = (folder / "shop.toml").read_text()
    if edit is not None:
        assert edit[0] in text
        text = text.replace(*edit)
    path = folder / "edited.toml"
    path.write_text(text)
    return load_policy(path)


def _ask(engine: Engine, sql: str) -> list:
    return engine.query("ann", {"sql": sql, "epsilon": EPSILON, "fresh": True})["rows"]


def test_a_chain_of_links_settles_each_table_to_the_unit(folder):
    tables = _policy(folder).datasets["shop"].tables
    assert tables["orders"].unit == "o_custkey" and tables["orders"].via is None
    assert tables["lineitem"].unit == DERIVED_UNIT
    assert tables["lineitem"].via == Via("l_orderkey", "orders", "o_orderkey", "int")
    schema = _policy(folder).datasets["shop"].as_dict()["tables"]
    assert "unit" not in schema["lineitem"]  # the gate's own column is never shown
    assert schema["lineitem"]["links"] == {"l_orderkey": "orders.o_orderkey"}


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (  # a circle never reaches the person
            ('links = { o_custkey = "customer.c_custkey" }',
             'links = { o_custkey = "lineitem.l_partkey" }'),
            "never reaches the privacy unit",
        ),
        (  # a text column cannot name an integer key
            ('links = { l_orderkey = "orders.o_orderkey" }',
             'links = { l_flag = "orders.o_orderkey" }'),
            "str cannot name a int key",
        ),
        (  # one way to the person
            ('links = { l_orderkey = "orders.o_orderkey" }',
             'links = { l_orderkey = "orders.o_orderkey", l_partkey = "orders.o_custkey" }'),
            "link one column",
        ),
        (  # a table with its own unit column reaches the person that way only
            ('links = { l_orderkey = "orders.o_orderkey" }',
             'unit = "l_partkey"\nlinks = { l_orderkey = "orders.o_orderkey" }'),
            "reaches its person one way",
        ),
        (
            ('links = { l_orderkey = "orders.o_orderkey" }',
             'links = { l_orderkey = "part.p_partkey" }'),
            "is not a column of a declared private table",
        ),
    ],
)  # fmt: skip
def test_links_that_cannot_reach_the_person_are_refused_at_load(folder, edit, says):
    with pytest.raises(PolicyError, match=says):
        _policy(folder, edit)


def _prepared(engine: Engine, sql: str) -> list[tuple]:
    database = engine.databases["shop"]  # the gate's own prepared copy
    return database._cursor().execute(sql).fetchall()


def test_each_prepared_row_holds_the_unit_of_the_order_it_names(engine, folder):
    """The preparation's units against the join written by hand on the owner's data:
    every line of an order that exists keeps its customer, and only those."""
    con = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    truth = con.execute(
        "SELECT l_orderkey, o_custkey, count(*) FROM lineitem JOIN orders "
        "ON l_orderkey = o_orderkey GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    got = _prepared(
        engine,
        f'SELECT l_orderkey, "{DERIVED_UNIT}", count(*) FROM lineitem GROUP BY ALL ORDER BY ALL',
    )
    assert got == truth and len(truth) > 50


def test_a_line_whose_order_is_missing_is_dropped(tmp_path):
    shop.build(tmp_path / "shop.duckdb", customers=5, keys=False)
    con = duckdb.connect(str(tmp_path / "shop.duckdb"))
    con.execute("INSERT INTO lineitem VALUES (999999, 1, 'A', 3, 10.0)")  # no such order
    lines = con.execute("SELECT count(*) FROM lineitem").fetchone()[0]
    con.close()
    (tmp_path / "p.toml").write_text(shop.policy_text(tmp_path / "shop.duckdb", tmp_path / "s"))
    e = Engine(load_policy(tmp_path / "p.toml"))
    try:
        assert _prepared(e, "SELECT count(*) FROM lineitem") == [(lines - 1,)]
        assert _prepared(e, "SELECT count(*) FROM lineitem WHERE l_orderkey = 999999") == [(0,)]
    finally:
        e.close()


def test_a_key_that_repeats_refuses_the_start_naming_no_value(tmp_path):
    shop.build(tmp_path / "shop.duckdb", customers=5, keys=False)
    con = duckdb.connect(str(tmp_path / "shop.duckdb"))
    con.execute("INSERT INTO orders VALUES (3, 4, '1-URGENT', 77.5)")  # order 3 twice
    con.close()
    (tmp_path / "p.toml").write_text(shop.policy_text(tmp_path / "shop.duckdb", tmp_path / "s"))
    with pytest.raises(PolicyError) as info:
        Engine(load_policy(tmp_path / "p.toml"))
    message = str(info.value)
    assert "lineitem.l_orderkey links to orders.o_orderkey" in message
    assert "not a key" in message
    assert not any(ch.isdigit() for ch in message)  # no key value, no count


def test_a_join_along_the_chain_answers_near_the_bounded_truth(engine, folder):
    sql = (
        "SELECT c_segment, COUNT(*) AS n FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
        "JOIN customer ON o_custkey = c_custkey GROUP BY c_segment ORDER BY c_segment"
    )
    con = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    truth = dict(con.execute(sql).fetchall())
    got = dict(_ask(engine, sql))
    assert sorted(got) == sorted(truth)
    for segment, n in got.items():
        # Each customer keeps at most 8 joined rows (max_rows_per_partition): a count
        # falls short of the truth, never above it by more than the noise.
        assert n <= truth[segment] + 2
        assert n >= 0.3 * truth[segment]


def test_exists_over_the_lines_of_an_order_is_answered(engine, folder):
    sql = (
        "SELECT COUNT(*) FROM orders WHERE EXISTS (SELECT * FROM lineitem "
        "WHERE l_orderkey = o_orderkey AND l_flag = 'R')"
    )
    con = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    ((truth,),) = con.execute(sql).fetchall()
    ((got,),) = _ask(engine, sql)
    assert abs(got - truth) <= 3


def test_a_join_on_another_key_is_refused_and_says_the_link(engine):
    with pytest.raises(GateError) as info:
        _ask(engine, "SELECT COUNT(*) FROM lineitem JOIN orders ON l_partkey = o_orderkey")
    assert "lineitem.l_orderkey = orders.o_orderkey" in info.value.message
    assert DERIVED_UNIT not in info.value.message


def _units_equal(sql: str, folder: Path) -> list[str]:
    dataset = _policy(folder).datasets["shop"]
    resolved = resolve(parse(sql), dataset)
    where = resolved.tree.args["where"].this
    return [
        e.sql()
        for e in where.find_all(exp.EQ)
        if DERIVED_UNIT in e.sql() or {c.name for c in e.find_all(exp.Column)} == {"o_custkey"}
    ]


@pytest.mark.parametrize(
    ("sql", "count"),
    [
        ("SELECT COUNT(*) FROM lineitem JOIN orders ON l_orderkey = o_orderkey", 1),
        ("SELECT COUNT(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey", 1),
        ("SELECT COUNT(*) FROM lineitem a JOIN lineitem b ON a.l_orderkey = b.l_orderkey", 1),
        (
            "SELECT COUNT(*) FROM lineitem, orders, customer "
            "WHERE l_orderkey = o_orderkey AND o_custkey = c_custkey",
            1,
        ),
    ],
)
def test_a_join_along_a_link_gets_the_unit_equality(sql, count, folder):
    """The structural defence: whatever the key holds, the joined rows share a unit."""
    found = _units_equal(sql, folder)
    assert len(found) == count, found


def test_without_the_added_equality_a_link_join_is_refused(folder, monkeypatch):
    """The broken version: the ties ``_unit`` reads are the added equalities, so a
    resolver that stopped adding them refuses (rather than mixing units)."""
    monkeypatch.setattr(resolve_module, "along_links", lambda scans, filters: None)
    dataset = _policy(folder).datasets["shop"]
    sql = "SELECT COUNT(*) FROM lineitem JOIN orders ON l_orderkey = o_orderkey"
    with pytest.raises(GateError, match="must match their privacy units"):
        resolve(parse(sql), dataset)
