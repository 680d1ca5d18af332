"""Search, not shapes: no reply's status, error or padding slot hinges on one unit's work.

Two real gates (``Engine``s, each on its own DuckDB file and ledger): D, and D'
without a target unit who has 40 visits, ten times the load cap, so that any
shape that multiplies a unit's rows multiplies the target's most. Hypothesis
draws queries from a grammar of the shapes that multiply rows: self-joins of
private tables up to twelve scans (``JOIN … ON``, ``USING``, or references to
one CTE), a public table joined on a key or on a condition, semi-joins with a
join inside, group keys chosen by partition selection, ``COUNT(DISTINCT
unit)``, quantiles, and filters on the target's id or attributes. Both gates
must agree on the reply's kind, status and message, and on its padding slot
(``elapsed // SLOT_S``: a quantum four times the gate's default padding, so
that only work the target adds, not the machine's jitter, moves a reply across
it; where the slots differ, each side's fastest of three runs must be less than a
slot apart, so that neither a pause of the machine's nor two times astride a
slot's edge is taken for the target's work). The same search
against the bounding the window path had before (each scan of a join keeps
the whole load cap of its unit: ``_whole_cap``) is shown to fail, on the
first shape it finds. ``-m fuzz`` runs thousands of
examples; Spark's pair is in tests/system/test_spark_fuzz.py.

The operators' grammar (``operating``: ``LIKE``/``ILIKE`` patterns that retry at
every position, text functions over the target's 4-byte and folding texts, CTE
chains doubling a text up to the caps) is searched the same way; with ``LIKE``
priced as it was (the text's length times its wildcards over 64), the search finds
a pattern on the target's doubled texts that sends D's reply slots later.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import Phase, example, given, settings
from sqlglot import exp

from dpmagic.gate.engine import Engine
from dpmagic.gate.engines.ranking import RANK
from dpmagic.gate.sql import plan as plans
from dpmagic.gate.sql import prices, work
from dpmagic.gate.sql import rewrite as rewrites
from dpmagic.gate.sql.ranks import RoomRead
from tests.gate_helpers import running_engine
from tests.work_search import (
    ASKED,
    POLICY,
    SEARCH,
    TARGET,
    compare,
    multiplying,
    operating,
    tables,
)


@pytest.fixture(scope="module")
def gates(tmp_path_factory) -> Iterator[tuple[Engine, Engine]]:
    with (
        running_engine(tmp_path_factory.mktemp("d"), POLICY, tables(True)) as d,
        running_engine(tmp_path_factory.mktemp("d2"), POLICY, tables(False)) as d2,
    ):
        yield d, d2


# A nested loop over one unit's rows (an EXISTS comparing its rows with the query's
# row): the target's 40 visits, joined to themselves, each against each, whatever the
# search draws.
COMPARED = (
    "SELECT COUNT(*) FROM visits AS a0 JOIN visits AS a1 ON a1.pid = a0.pid "
    "WHERE NOT EXISTS (SELECT 1 FROM visits AS x WHERE x.pid = a0.pid "
    "AND x.day < a0.day AND x.diag <> a0.diag)"
)


@pytest.mark.search
@SEARCH
@given(sql=multiplying())
@example(sql=COMPARED)
def test_no_reply_hinges_on_one_units_work(gates, sql: str) -> None:
    compare(gates, sql)


@pytest.mark.fuzz
@settings(SEARCH, derandomize=False, max_examples=1200)  # sized for CI's time
@given(sql=multiplying())
def test_fuzz_no_reply_hinges_on_one_units_work(gates, sql: str) -> None:
    compare(gates, sql)


# A shape of ``multiplying()`` that separates D from D' whatever the machine's speed:
# twelve scans of the target's rows (four a scan under the whole cap: 4^12) times the
# codes below its day, on D; no row at all on D', which has no such unit.
FOUND = (
    "WITH c AS (SELECT pid, diag, day, note FROM visits) SELECT a0.note, SUM(a0.day) "
    "FROM c AS a0 "
    + " ".join(f"JOIN c AS a{i} ON a{i}.pid = a0.pid" for i in range(1, 12))
    + f" JOIN codes AS r ON r.code < a0.day WHERE a0.pid = {TARGET} GROUP BY a0.note"
)


def _whole_cap(
    tables: list[str], cap: int, first: object = None, keyed: object = None
) -> list[RoomRead]:
    """Main's window path: every scan of a join keeps its unit's first ``cap`` ranks."""
    rank = exp.LTE(this=exp.column(RANK, quoted=True), expression=exp.Literal.number(cap))
    return [RoomRead(exp.table_(t, quoted=True), rank.copy()) for t in tables]


@pytest.mark.search
def test_the_search_catches_bounding_after_the_join(gates) -> None:
    """With each scan keeping the whole cap, a search of the same grammar finds a query
    on which D and D' differ (a time-out, or a later slot) within its budget."""
    found: list[str] = []

    # The first failure, unshrunk and alone: shrinking would ask again and again (the
    # gate refuses a user whose queries keep running out of time, max_resource_failures),
    # and two failures at different lines would come as a group, not an AssertionError.
    # Most shapes separate D from D' here by time alone (D's run past the limit, D''s
    # within it), which a fast or a loaded machine can blur, so the search starts from
    # one that separates them by what each answers (``FOUND``).
    @settings(
        SEARCH,
        max_examples=200,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
    )
    @given(sql=multiplying())
    @example(sql=FOUND)
    def search(sql: str) -> None:
        try:
            # Other users: the analyses cached for the searcher hold the sound SQL, and
            # each of these is a new one to the failure count.
            compare(gates, sql, user=f"broken{next(ASKED)}")
        except AssertionError:
            found.append(sql)
            raise

    patch = pytest.MonkeyPatch()
    patch.setattr(rewrites, "room_reads", _whole_cap)
    try:
        with pytest.raises(AssertionError, match="hinges on the target unit"):
            search()
    finally:
        patch.undo()
    assert found


@pytest.mark.search
@SEARCH
@given(sql=operating())
def test_no_reply_hinges_on_one_units_text_work(gates, sql: str) -> None:
    compare(gates, sql)


@pytest.mark.fuzz
@settings(SEARCH, derandomize=False, max_examples=400)
@given(sql=operating())
def test_fuzz_no_reply_hinges_on_one_units_text_work(gates, sql: str) -> None:
    compare(gates, sql)


def _main_price(node: exp.Expression, r) -> int:
    """Main's prices: one step per node and one more per 64 characters it may read, a
    ``LIKE`` once per wildcard (and no ``max_text_length`` or ``max_row_work``)."""
    chars = max([prices._chars(node, r), *(prices._chars(c, r) for c in node.iter_expressions())])
    if isinstance(node, exp.Like | exp.ILike):
        pattern = node.expression.this
        chars = prices._chars(node.this, r) * (1 + pattern.count("%") + pattern.count("_"))
    return 1 + math.ceil(chars / 64)


# The shape on the search's data: the target's texts doubled six times (65,536
# characters) against a 19,000-character pattern with a ``_``, retried at every position
# (1.5–2 s on D under main's prices, 0.03 s on D').
LIKE_FOUND = (
    "WITH c0 AS (SELECT pid, day, memo AS s FROM visits), "
    + ", ".join(f"c{i} AS (SELECT pid, day, s || s AS s FROM c{i - 1})" for i in range(1, 7))
    + " SELECT COUNT(*) FROM c6 WHERE s LIKE '%"
    + "a" * 19000
    + "_b%'"
)


@pytest.mark.search
def test_the_search_catches_a_like_priced_linearly(gates) -> None:
    """With main's prices (``LIKE`` linear in its text, a step per 64 characters, no
    row or text cap), the operators' search finds a query whose reply leaves a slot
    (or more) later on D than on D'."""

    @settings(SEARCH, max_examples=60, phases=[Phase.explicit, Phase.generate],
              report_multiple_bugs=False)  # fmt: skip
    @given(sql=operating())
    @example(sql=LIKE_FOUND)
    def search(sql: str) -> None:
        compare(gates, sql, user=f"linear{next(ASKED)}")

    patch = pytest.MonkeyPatch()
    patch.setattr(work, "price", _main_price)
    patch.setattr(work, "DERIVED_TEXTS", ())
    patch.setattr(plans, "within", lambda w, limit, _row, unit: work.within(w, limit, 2**62, unit))
    try:
        with pytest.raises(AssertionError, match="hinges on the target unit"):
            search()
    finally:
        patch.undo()
