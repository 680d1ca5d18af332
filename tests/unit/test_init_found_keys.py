"""Sources that declare no foreign keys (CSV files here; a Spark catalog in the Spark
suite): ``init`` finds the links their data shows (``init_keys.py``: a column named
for another table's unique column, every value one of its values) and writes them
with the owner's yes; without it, it says which it found and the flag that writes it.
A key that repeats, or a value that names no row, is not offered."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dpmagic.commands.init_keys import found_keys
from dpmagic.commands.init_policy import (
    InitError,
    parse_answers,
    plan,
    read_data,
    report,
    write_plan,
)
from dpmagic.gate.policy import load_policy
from tests.unit.test_init_links import _answer

CUSTOMERS, ORDERS_EACH, LINES_EACH = 400, 3, 2


def _shop(folder: Path, *, repeat_order: bool = False, stray_customer: bool = False) -> list[Path]:
    """customer ← orders ← lineitem, keys named as TPC-H names them; each customer
    has three orders of two lines, and a part key no table holds."""
    folder.mkdir(exist_ok=True)
    customers = "".join(f"{c},n{c}\n" for c in range(CUSTOMERS))
    orders = [(c * ORDERS_EACH + i, c) for c in range(CUSTOMERS) for i in range(ORDERS_EACH)]
    if stray_customer:
        orders.append((len(orders), CUSTOMERS + 5))
    if repeat_order:
        orders.append((orders[0][0], 1))
    lines = [(o, 7 + i, i + 1) for o, _ in orders[: CUSTOMERS * ORDERS_EACH] for i in range(2)]
    (folder / "customer.csv").write_text("c_custkey,c_name\n" + customers)
    (folder / "orders.csv").write_text(
        "o_orderkey,o_custkey\n" + "".join(f"{o},{c}\n" for o, c in orders)
    )
    (folder / "lineitem.csv").write_text(
        "l_orderkey,l_partkey,l_quantity\n" + "".join(f"{o},{p},{q}\n" for o, p, q in lines)
    )
    return [folder / f"{t}.csv" for t in ("customer", "orders", "lineitem")]


def test_the_keys_the_data_shows_are_found_and_no_others(tmp_path: Path) -> None:
    data = read_data(_shop(tmp_path / "shop"))
    found = {str(fk) for t in data.tables.values() for fk in t.foreign_keys}
    assert found == {
        "orders.o_custkey → customer.c_custkey",
        "lineitem.l_orderkey → orders.o_orderkey",
    }
    assert all(fk.found for t in data.tables.values() for fk in t.foreign_keys)


def test_with_yes_the_chain_is_written_and_a_gate_answers_along_it(tmp_path: Path) -> None:
    out = tmp_path / "policy.toml"
    settled = plan(read_data(_shop(tmp_path / "shop")), "c_custkey", parse_answers(yes=True))
    write_plan(settled, out)
    raw = tomllib.loads(out.read_text())["datasets"]["shop"]["tables"]
    assert raw["orders"]["links"] == {"o_custkey": "customer.c_custkey"}
    assert raw["lineitem"]["links"] == {"l_orderkey": "orders.o_orderkey"}
    said = "\n".join(report(settled))
    assert (
        "lineitem: the person is read along l_orderkey → orders.o_orderkey (found in the data"
        in said
    )
    ds = load_policy(out).dataset("shop")
    assert ds.tables["lineitem"].via is not None and ds.tables["lineitem"].via.table == "orders"
    ((n,),) = _answer(out, "SELECT COUNT(*) AS n FROM lineitem")
    # Each customer's six lines, as many as a group keeps of one person: a count of
    # 1,600 or 2,400 whose noise is tens (its 95% error ±12), never a quarter of it.
    true = CUSTOMERS * min(ORDERS_EACH * LINES_EACH, ds.max_rows_per_partition)
    assert abs(n - true) <= 0.25 * true


def test_without_yes_nothing_found_is_written_and_the_flag_is_named(tmp_path: Path) -> None:
    """Found in the data is the owner's to confirm: with nobody to ask and no --yes,
    init stops on the first table it cannot settle, naming the found key's flag."""
    with pytest.raises(InitError) as info:
        plan(read_data(_shop(tmp_path / "shop")), "c_custkey", parse_answers())
    message = str(info.value)
    assert "--link orders.o_custkey=customer.c_custkey" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("broken", "lost"),
    [
        ({"repeat_order": True}, "lineitem.l_orderkey → orders.o_orderkey"),
        ({"stray_customer": True}, "orders.o_custkey → customer.c_custkey"),
    ],
)
def test_a_repeated_key_or_a_value_naming_no_row_is_not_offered(
    tmp_path: Path, broken: dict, lost: str
) -> None:
    data = read_data(_shop(tmp_path / "shop", **broken))
    found = {str(fk) for t in data.tables.values() for fk in t.foreign_keys}
    assert lost not in found and len(found) == 1


def test_declared_keys_are_not_second_guessed(tmp_path: Path) -> None:
    """A source that declares keys is read as it declares them: nothing is searched."""
    data = read_data(_shop(tmp_path / "shop"))
    for table in data.tables.values():
        table.foreign_keys = [fk for fk in table.foreign_keys if fk.table != "lineitem"]
    assert found_keys(data) == []


def test_a_table_of_one_row_per_key_is_not_linked_to_another(tmp_path: Path) -> None:
    """``details`` holds one row per customer too: two lists of the same customers,
    not a way to one (the column named for the unit already says whose a row is)."""
    files = _shop(tmp_path / "shop")
    (tmp_path / "shop" / "details.csv").write_text(
        "c_custkey,c_segment\n" + "".join(f"{c},s{c % 5}\n" for c in range(CUSTOMERS))
    )
    data = read_data([*files, tmp_path / "shop" / "details.csv"])
    assert data.tables["details"].foreign_keys == []  # nor customer's to details
    assert data.tables["customer"].foreign_keys == []
