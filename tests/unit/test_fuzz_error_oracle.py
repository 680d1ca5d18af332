"""A grammar-based differential fuzzer for the gate's error oracle.

A reply's status is released with no noise at all, so it must not depend on
whether one unit is in the data. This module asks real gates on neighbouring
datasets (D, and D' = D without one target unit whose rows hold edge values)
the same generated queries and asserts the same outcome on both: answered or
not, the same error kind and message, the same charge (the reply's cost and
what the ledger recorded). The queries come from ``sql_grammar``, which is
built from the checker's own allow-list, so the search covers every operator,
function, cast target and literal kind the gate accepts, placed in ``WHERE``,
in aggregate arguments and ``FILTER``, inside ``CASE WHEN <the target's
attributes>`` and as group keys, over one table, two private tables joined on
the unit, and a private table joined to a public one.

The gates are ``Engine``s, in-process, each on its own policy, DuckDB file and
SQLite ledger: exactly what the server calls. A few examples also go through
two real gate processes over their unix sockets, comparing HTTP statuses.

Release-level expressions (arithmetic over aggregates, ``HAVING``, ``ORDER
BY``) are post-processing of noisy values: their success may differ between
D and D' through the noise alone, so only what the gate decides before the
noise (refusal and its message, the charge) is compared there.

Two budgets: the default run tries a fixed, derandomized number of examples
(ten for each release-level property, a few seconds); ``pytest -m fuzz`` runs
the same properties (tests/system/test_fuzz_error_oracle.py) with hundreds to
thousands of examples each (about ten minutes), as CI does.
"""

# ruff: noqa: F811 - the fuzzer's fixtures are tests/error_oracle.py's

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.error_oracle import (  # noqa: F401
    DEFAULT,
    KEYED_QUERIES,
    LEFT_QUERIES,
    LINKED,
    PER_PERSON_QUERIES,
    RELEASE_QUERIES,
    ROW_QUERIES,
    SEMI_QUERIES,
    STAGED_QUERIES,
    Pair,
    ask_both,
    compare,
    folder,
    pair,
)


@pytest.mark.search
@DEFAULT
@given(sql=ROW_QUERIES)
def test_row_expressions_never_hinge_on_one_unit(pair: Pair, sql: str) -> None:
    compare(pair, sql)


@settings(DEFAULT, max_examples=10)
@given(sql=RELEASE_QUERIES)
def test_release_expressions_differ_by_noise_only(pair: Pair, sql: str) -> None:
    compare(pair, sql, release_level=True)


@pytest.mark.search
@settings(DEFAULT, max_examples=150)
@given(sql=st.one_of(SEMI_QUERIES, LEFT_QUERIES))
def test_conditions_in_semi_joins_and_join_conditions_never_hinge_on_one_unit(
    pair: Pair, sql: str
) -> None:
    compare(pair, sql)


@pytest.mark.search
@settings(DEFAULT, max_examples=150)
@given(sql=PER_PERSON_QUERIES)
def test_per_person_subqueries_never_hinge_on_one_unit(pair: Pair, sql: str) -> None:
    compare(pair, sql)


@settings(DEFAULT, max_examples=10)
@given(sql=st.one_of(STAGED_QUERIES, KEYED_QUERIES))
def test_releases_inside_a_query_differ_by_noise_only(pair: Pair, sql: str) -> None:
    """A subquery released first, then compared with rows: what the gate decides before
    the noise (a refusal and its text, the charge) is the same on D and D'."""
    compare(pair, sql, release_level=True)


def test_the_tables_linked_by_keys_are_answered_on_both_gates(pair: Pair) -> None:
    """The search's chain of links (``l.oid → o.oid → t.pid``) reaches the engine: a
    join along it, the chain to the unit's own table and a semi-join over the lines of
    an order are answered on D and D' alike, so the search over them searches answers,
    not refusals."""
    for sql in (
        f"SELECT l.tag, COUNT(*), SUM(l.qty) FROM {LINKED} GROUP BY l.tag",
        "SELECT COUNT(*) FROM t JOIN o ON o.pid = t.pid JOIN l ON o.oid = l.oid",
        "SELECT COUNT(*) FROM o WHERE EXISTS (SELECT 1 FROM l WHERE l.oid = o.oid AND l.qty > 9)",
    ):
        with_target, without = ask_both(pair, sql)
        assert with_target.kind == without.kind == "ok", (sql, with_target, without)
        assert with_target.charged == without.charged
