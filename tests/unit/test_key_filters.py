"""A key the ``WHERE`` holds to literals keeps only those of its public values
(``sql/keys.py``, ``_held_to``): TPC-H's q12 groups by ``l_shipmode`` under
``l_shipmode IN ('MAIL', 'SHIP')``, and released seven rows, five of them empty by
the query's own text, at the sensitivity of a person reaching four of them.

The property that matters is that no row the query keeps has a key outside the
domain: the SQL keeps only rows whose key is in it, so a value left out would drop
rows silently. It is searched over conditions built from ``=``, ``IN``, ``AND``,
``OR`` and ``NOT``, each checked against DuckDB's own reading of the condition on
rows with every declared value, NULL and an undeclared one; a broken reading of
``OR`` (its first branch alone) or of ``NOT`` (read through) is caught.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.sql import keys
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import dataset, make_plan

MODES = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"]
DS = dataset(
    {
        "pid": {"type": "int"},
        "mode": {"type": "str", "public_values": MODES},
        "n": {"type": "int", "lower": 0, "upper": 3},
        "x": {"type": "float", "lower": 0, "upper": 10},
    },
    max_partitions=4,
    max_rows=8,
)


def domains(sql: str) -> list[tuple[object, ...]]:
    bounded = bound(check(resolve(parse(sql), DS)))
    return [d.values for d in bounded.domains]


@pytest.mark.parametrize(
    ("where", "kept"),
    [
        ("mode IN ('MAIL', 'SHIP')", ["MAIL", "SHIP"]),
        ("'SHIP' = mode AND x > 1", ["SHIP"]),
        ("(mode = 'MAIL' AND x > 1) OR mode = 'SHIP'", ["MAIL", "SHIP"]),
        (
            "mode IN ('MAIL', 'SHIP', 'AIR') AND mode <> 'AIR' AND mode IN ('SHIP', 'AIR')",
            ["AIR", "SHIP"],
        ),
        # Not held to literals: every declared value stays.
        ("mode = 'MAIL' OR x > 1", MODES),
        ("NOT mode IN ('MAIL', 'SHIP')", MODES),
        ("mode IN ('MAIL', 'SHIP') OR mode IS NULL", MODES),
        ("mode = 'BARGE'", MODES),  # no declared value meets it: the answer is empty anyway
    ],
)
def test_a_key_held_to_literals_keeps_those_values(where: str, kept: list[str]) -> None:
    (domain,) = domains(f"SELECT mode, COUNT(*) AS c FROM t WHERE {where} GROUP BY mode")
    assert list(domain) == [m for m in MODES if m in kept]


def test_an_integer_key_is_held_too_and_other_keys_keep_their_values() -> None:
    sql = "SELECT n, mode, COUNT(*) AS c FROM t WHERE n IN (1, 3) GROUP BY n, mode"
    assert domains(sql) == [(1, 3), tuple(MODES)]


def test_fewer_partitions_are_fewer_a_person_can_reach() -> None:
    """Four of seven values reachable: each person's count moves four cells; two values
    held by the filter: two, and the noise halves."""

    def sensitivity(where: str) -> float:
        p = make_plan(f"SELECT mode, COUNT(*) AS c FROM t {where} GROUP BY mode", DS)
        (m,) = p.measurements
        return m.noise.sensitivity

    assert sensitivity("WHERE mode IN ('MAIL', 'SHIP')") * 2 == sensitivity("")


# -- the search: no row the condition keeps falls outside the domain -----------------

VALUES = [*MODES, "BARGE"]  # one undeclared: the key filter drops it, as the SQL would


def _atom() -> st.SearchStrategy[str]:
    # A few values, so that branches overlap in part as often as not; conditions that
    # hold the key, four times as often as the others.
    literal = st.sampled_from(["AIR", "MAIL", "SHIP", "BARGE"]).map(lambda v: f"'{v}'")
    listed = st.lists(literal, min_size=1, max_size=3).map(lambda vs: f"mode IN ({', '.join(vs)})")
    holding = st.one_of(
        literal.map(lambda v: f"mode = {v}"), literal.map(lambda v: f"{v} = mode"), listed, listed
    )
    other = st.one_of(
        literal.map(lambda v: f"mode <> {v}"),
        st.integers(0, 3).map(lambda k: f"n = {k}"),
        st.just("x > 5"),
    )
    return st.one_of(holding, holding, holding, holding, other)


CONDITIONS = st.recursive(
    _atom(),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda ab: f"({ab[0]} AND {ab[1]})"),
        st.tuples(inner, inner).map(lambda ab: f"({ab[0]} OR {ab[1]})"),
        st.tuples(inner, inner).map(lambda ab: f"({ab[0]} OR {ab[1]})"),
        inner.map(lambda a: f"(NOT {a})"),
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def rows() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (mode VARCHAR, n BIGINT, x DOUBLE)")
    con.executemany(
        "INSERT INTO t VALUES (?, ?, ?)",
        [(m, n, x) for m in [*VALUES, None] for n in range(4) for x in (1.0, 9.0)],
    )
    return con


def _kept_outside(con: duckdb.DuckDBPyConnection, where: str) -> set[str]:
    """Declared key values of rows the condition keeps that the domain left out."""
    (domain,) = domains(f"SELECT mode, COUNT(*) AS c FROM t WHERE {where} GROUP BY mode")
    kept = {m for (m,) in con.execute(f"SELECT DISTINCT mode FROM t WHERE {where}").fetchall()}
    return {m for m in kept if m in MODES} - set(domain)


@pytest.mark.search
@settings(max_examples=400, deadline=None)
@given(where=CONDITIONS)
def test_no_row_the_condition_keeps_is_left_out_of_the_domain(rows, where: str) -> None:
    assert _kept_outside(rows, where) == set()


def _or_as_its_first_branch(cond: exp.Expression) -> exp.Expression | None:
    return cond.this if isinstance(cond, exp.Or) else None


def _not_read_through(cond: exp.Expression) -> exp.Expression | None:
    return cond.this if isinstance(cond, exp.Not) else None


@pytest.mark.parametrize("misread", [_or_as_its_first_branch, _not_read_through])
def test_the_search_catches_a_misread_condition(rows, monkeypatch, misread) -> None:
    """Broken on purpose: ``OR`` read as its first branch, or ``NOT`` read as what it
    negates. The search finds a condition whose kept rows fall outside the domain."""
    real = keys._held_to

    def broken(cond: exp.Expression, name: str, column_type: str) -> set[object] | None:
        cond = keys.unparen(cond)
        read = misread(cond)
        return real(cond if read is None else read, name, column_type)

    monkeypatch.setattr(keys, "_held_to", broken)
    found = []

    @settings(max_examples=400, deadline=None, database=None, phases=[Phase.generate])
    @given(where=CONDITIONS)
    def search(where: str) -> None:
        if _kept_outside(rows, where):
            found.append(where)
            raise AssertionError(where)

    with pytest.raises(AssertionError):
        search()
    assert found
