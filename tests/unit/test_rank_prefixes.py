"""A DuckDB store reads a unit's first ranks as a prefix of row ids (``Dialect.first_ranks``):
the rows it reads are exactly those ``rank <= room`` keeps, for every room and every
spread of units' rows; a file not stored in rank order keeps the rank filter; the
number of rows, which depends on the data, is bound as a parameter and written into
no SQL text; and no other parameter passes the guard."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.engines.duckdb import database
from dpmagic.gate.engines.duckdb.prepared import prepared_file
from dpmagic.gate.engines.ranking import RANK, first_ranks, load_cap
from dpmagic.gate.failures import Refused
from tests.gate_helpers import running_engine

POLICY = """
[gate]
state_dir = "{state}"

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
max_partitions = {partitions}
max_rows_per_partition = {rows}
user_budget = {{ epsilon = 100 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
x = {{ type = "int", lower = 0, upper = 99 }}
"""


def _policy(folder: Path, partitions: int, rows: int) -> str:
    return POLICY.format(state=folder / "state", partitions=partitions, rows=rows)


def _read(store: database.Database, bound: exp.Expression) -> list[tuple]:
    """The rows of ``t`` that ``bound`` keeps, through the store's guard and run."""
    tree = exp.select(exp.column("pid"), exp.column(RANK, quoted=True), exp.column("x"))
    sql = tree.from_(exp.table_("t")).where(bound).sql("duckdb")
    store.vet(sql)
    return sorted(store.run(sql).rows)


@pytest.mark.search
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=40),
    partitions=st.integers(1, 3),
    rows=st.integers(1, 3),
)
def test_a_prefix_reads_exactly_the_rows_the_rank_filter_keeps(
    tmp_path_factory, sizes: list[int], partitions: int, rows: int
) -> None:
    """Units of 0 to 12 rows, every room up to the load cap and one past it."""
    folder = tmp_path_factory.mktemp("prefix")
    table = [(unit, (unit * 7 + i) % 100) for unit, size in enumerate(sizes) for i in range(size)]
    with running_engine(folder, _policy(folder, partitions, rows), {"t": ("pid,x", table)}) as e:
        store = e.databases["d"]
        assert store.dialect.rank_prefixes
        cap = load_cap(e.policy.datasets["d"])
        for room in range(1, cap + 1):
            prefix = store.dialect.first_ranks("t", room)
            assert isinstance(prefix, exp.LT)
            assert _read(store, prefix) == _read(store, first_ranks("t", room))
        assert len(_read(store, first_ranks("t", cap + 1))) <= len(table)


def test_the_count_is_bound_not_written(tmp_path: Path) -> None:
    """The generated SQL names the prefix's end; its value appears in no text the gate
    writes, and the answer is the rank filter's."""
    folder = tmp_path
    table = [(unit, unit % 100) for unit in range(1000) for _ in range(1 + unit % 4)]
    with running_engine(folder, _policy(folder, 1, 2), {"t": ("pid,x", table)}) as e:
        store = e.databases["d"]
        kept = sum(min(1 + unit % 4, 2) for unit in range(1000))
        seen: list[str] = []
        run = store.run
        store.run = lambda sql, *a, **k: seen.append(sql) or run(sql, *a, **k)  # type: ignore[method-assign]
        e.query("alice", {"sql": "SELECT COUNT(*) FROM t", "epsilon": 50, "fresh": True})
        (sql,) = seen
        assert "rowid < $__dpmagic_end_" in sql and str(kept) not in sql
        assert store._parameters(store._guard(store._db.cursor(), sql)) == {
            name: kept for name in store._guard(store._db.cursor(), sql)
        }
        assert store.run(sql).rows == [(kept,)]


def test_no_other_parameter_passes_the_guard(tmp_path: Path) -> None:
    table = [(unit, 1) for unit in range(10)]
    with running_engine(tmp_path, _policy(tmp_path, 1, 1), {"t": ("pid,x", table)}) as e:
        store = e.databases["d"]
        with pytest.raises(Refused, match="will not run"):
            store.vet("SELECT COUNT(*) FROM t WHERE rowid < $anything")


def _store_by_unit(folder: Path, policy: object) -> None:
    """Rewrite the prepared file's table in unit order, as a gate before the rank order
    stored it."""
    path = prepared_file(policy.datasets["d"], policy.gate)
    con = duckdb.connect(str(path))
    try:
        con.execute(f'CREATE OR REPLACE TABLE t AS SELECT * FROM t ORDER BY pid DESC, "{RANK}"')
    finally:
        con.close()


def test_a_file_not_in_rank_order_keeps_the_rank_filter(tmp_path: Path, monkeypatch) -> None:
    """Stored in unit order, a unit's first ranks are not the table's first rows: the
    store sees it and reads by the rank. With the check skipped (the broken version),
    the prefix reads other rows than the rank filter."""
    table = [(u, (u + 31 * i) % 100) for u in range(300) for i in range(3)]
    policy_text = _policy(tmp_path, 1, 1)
    with running_engine(tmp_path, policy_text, {"t": ("pid,x", table)}) as e:
        policy = e.policy
        kept = _read(e.databases["d"], first_ranks("t", 1))
    _store_by_unit(tmp_path, policy)
    with running_engine(tmp_path, policy_text) as e:  # the same sources: the same file
        store = e.databases["d"]
        assert not store.dialect.rank_prefixes
        assert _read(store, store.dialect.first_ranks("t", 1)) == kept
    monkeypatch.setattr(database.Database, "_rank_ends", _unchecked_ends)
    with running_engine(tmp_path, policy_text) as e:
        store = e.databases["d"]
        assert store.dialect.rank_prefixes
        assert _read(store, store.dialect.first_ranks("t", 1)) != kept


def _unchecked_ends(self: database.Database, dataset) -> dict[str, int]:
    """The broken version: the ends counted by rank, the order not checked."""
    from dpmagic.gate.engines.ranking import rank_end

    ends = {}
    for room in range(1, load_cap(dataset) + 1):
        ends[rank_end("t", room)] = self._one(f'SELECT COUNT(*) FROM t WHERE "{RANK}" <= {room}')
    return ends


def test_a_load_cap_too_large_to_list_keeps_the_rank_filter(tmp_path: Path) -> None:
    """The store lists an end per room up to the load cap; past ``MAX_PREFIX_ROOMS``
    rooms it reads by the rank, and answers alike."""
    table = [(unit, unit % 100) for unit in range(50) for _ in range(3)]
    rows = database.MAX_PREFIX_ROOMS // 2 + 1
    with running_engine(tmp_path, _policy(tmp_path, 2, rows), {"t": ("pid,x", table)}) as e:
        store = e.databases["d"]
        assert load_cap(e.policy.datasets["d"]) > database.MAX_PREFIX_ROOMS
        assert not store.dialect.rank_prefixes
        assert isinstance(store.dialect.first_ranks("t", 2), exp.LTE)
        assert len(_read(store, store.dialect.first_ranks("t", 2))) == 100
