"""A small shop whose person is reached through keys, for the tests of link chains.

``customer`` is the privacy unit (one row a person), ``orders`` names its customer,
``lineitem`` names its order only (``lineitem → orders → customer``), and ``part``
is public. The tables declare their primary and foreign keys, as a real schema does,
so that ``dpmagic init`` can read the links from them. Deterministic for a seed.
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb

from tests.gate_helpers import insert_rows

SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")
PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM")
FLAGS = ("A", "N", "R")
PARTS = 20

POLICY = """
[gate]
state_dir = "{state}"

[datasets.shop]
database = "{database}"
privacy_unit = "c_custkey"
max_partitions = 4
max_rows_per_partition = 8
user_budget = {{ epsilon = 1e6 }}
notebook_budget = {{ epsilon = 1e6 }}
query_default = {{ epsilon = 1.0 }}

[datasets.shop.tables.customer]
unit = "c_custkey"
max_rows_per_unit = 1
columns.c_custkey = {{ type = "int" }}
columns.c_segment = {{ type = "str", public_values = {segments} }}
columns.c_acctbal = {{ type = "float", lower = -1000, upper = 10000 }}

[datasets.shop.tables.orders]
links = {{ o_custkey = "customer.c_custkey" }}
columns.o_orderkey = {{ type = "int" }}
columns.o_custkey = {{ type = "int" }}
columns.o_priority = {{ type = "str", public_values = {priorities} }}
columns.o_total = {{ type = "float", lower = 0, upper = 5000 }}

[datasets.shop.tables.lineitem]
links = {{ l_orderkey = "orders.o_orderkey" }}
columns.l_orderkey = {{ type = "int" }}
columns.l_partkey = {{ type = "int" }}
columns.l_flag = {{ type = "str", public_values = {flags} }}
columns.l_quantity = {{ type = "int", lower = 1, upper = 50 }}
columns.l_price = {{ type = "float", lower = 0, upper = 1000 }}

[datasets.shop.tables.part]
public = true
"""


def _toml_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def policy_text(database: Path, state: Path) -> str:
    return POLICY.format(
        database=database.as_posix(),
        state=state.as_posix(),
        segments=_toml_list(SEGMENTS),
        priorities=_toml_list(PRIORITIES),
        flags=_toml_list(FLAGS),
    )


def build(database: Path, customers: int = 60, seed: int = 7, *, keys: bool = True) -> None:
    """Write the shop to ``database``: about 3 orders a customer, 1–4 lines an order.
    ``keys``: declare the primary and foreign keys."""
    rng = random.Random(seed)
    pk = " PRIMARY KEY" if keys else ""
    con = duckdb.connect(str(database))
    con.execute(
        f"CREATE TABLE customer (c_custkey BIGINT{pk}, c_segment VARCHAR, c_acctbal DOUBLE)"
    )
    con.execute(f"CREATE TABLE part (p_partkey BIGINT{pk}, p_brand VARCHAR)")
    ref = " REFERENCES customer (c_custkey)" if keys else ""
    con.execute(
        f"CREATE TABLE orders (o_orderkey BIGINT{pk}, o_custkey BIGINT{ref}, "
        "o_priority VARCHAR, o_total DOUBLE)"
    )
    ref = " REFERENCES orders (o_orderkey)" if keys else ""
    pref = " REFERENCES part (p_partkey)" if keys else ""
    con.execute(
        f"CREATE TABLE lineitem (l_orderkey BIGINT{ref}, l_partkey BIGINT{pref}, "
        "l_flag VARCHAR, l_quantity BIGINT, l_price DOUBLE)"
    )
    customers_rows, orders_rows, lines = [], [], []
    order = 0
    for c in range(1, customers + 1):
        customers_rows.append((c, rng.choice(SEGMENTS), round(rng.uniform(-500, 9000), 2)))
        for _ in range(rng.randint(0, 6)):
            order += 1
            orders_rows.append((order, c, rng.choice(PRIORITIES), round(rng.uniform(10, 4000), 2)))
            for _ in range(rng.randint(1, 4)):
                lines.append(
                    (order, rng.randint(1, PARTS), rng.choice(FLAGS), rng.randint(1, 50),
                     round(rng.uniform(1, 900), 2))
                )  # fmt: skip
    # Each table in one insert, the referenced ones first (DuckDB's executemany runs
    # one INSERT a row).
    insert_rows(con, "part", [(p, f"Brand#{p % 5}") for p in range(1, PARTS + 1)])
    insert_rows(con, "customer", customers_rows)
    insert_rows(con, "orders", orders_rows)
    insert_rows(con, "lineitem", lines)
    con.close()
