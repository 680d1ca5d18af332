"""Releases inside a query (``sql/staged.py``, ``staged_releases.py``): a subquery
used as a value is released first with its share of ε, and the query compares rows
with the released value. The tree rules on their own; the whole path on a real
engine (its ledger, its replays, its dry run); and the property the stand-in rests
on: the last stage's plan and cost do not depend on the value released."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmagic.gate import staged_releases
from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError, OverBudget, Refused
from dpmagic.gate.policy import load_policy
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.pipeline import Asked, analyse
from dpmagic.gate.sql.staged import STAND_IN, split
from dpmagic.gate.sql.summary import summary
from tests import shop

ABOVE = "SELECT COUNT(*) FROM customer WHERE c_acctbal > (SELECT AVG(c_acctbal) FROM customer)"


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


def _split(sql: str):
    return split(parse(sql).tree)


# -- the tree rules ---------------------------------------------------------------


def test_only_subqueries_used_as_values_are_stages():
    assert _split("SELECT COUNT(*) FROM (SELECT * FROM customer) AS c") is None
    assert (
        _split(
            "SELECT COUNT(*) FROM orders WHERE o_custkey IN (SELECT c_custkey FROM customer) "
            "AND EXISTS (SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey)"
        )
        is None
    )
    staged = _split(ABOVE)
    assert staged is not None and staged.stages == ("SELECT AVG(c_acctbal) FROM customer",)
    assert staged.filled([12.5]) == "SELECT COUNT(*) FROM customer WHERE c_acctbal > 12.5"
    assert staged.filled([None]) == "SELECT COUNT(*) FROM customer WHERE c_acctbal > NULL"


def test_a_stage_takes_the_ctes_it_reads_and_only_those():
    staged = _split(
        "WITH rich AS (SELECT * FROM customer WHERE c_acctbal > 100), "
        "late AS (SELECT * FROM orders), top AS (SELECT * FROM rich) "
        "SELECT COUNT(*) FROM late WHERE o_total > (SELECT AVG(c_acctbal) FROM top)"
    )
    assert staged is not None
    ((stage,),) = [staged.stages]
    assert stage.startswith("WITH rich AS") and "top AS" in stage and "late" not in stage


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        (
            "SELECT COUNT(*) FROM orders o WHERE o_total > "
            "(SELECT AVG(o_total) FROM orders i WHERE i.o_custkey = o.o_custkey)",
            "correlated subquery",
        ),
        (
            "SELECT COUNT(*) FROM customer WHERE c_acctbal > (SELECT AVG(c_acctbal) FROM "
            "customer WHERE c_acctbal > (SELECT AVG(c_acctbal) FROM customer))",
            "holds another one",
        ),
        (
            "SELECT COUNT(*) FROM customer WHERE c_acctbal = ((SELECT MAX(c_acctbal) "
            "FROM customer))",
            "compare with <",
        ),
    ],
)
def test_what_cannot_be_a_stage_is_refused_with_why(sql, says):
    with pytest.raises(Refused, match=says):
        _split(sql)


# -- the last stage's plan does not depend on the value ----------------------------


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(st.none(), st.floats(-1e12, 1e12, allow_nan=False)))
def test_the_last_stage_is_planned_alike_whatever_value_was_released(folder, value):
    """The stand-in analysis decides refusals and cost before any stage runs: it holds
    only if the real value changes neither (its literal's shape is fixed)."""
    dataset = load_policy(folder / "shop.toml").dataset("shop")
    accountant = make_accountant(dataset.accountant)
    sql = (
        "SELECT c_segment, COUNT(*), SUM(CASE WHEN c_acctbal > (SELECT AVG(c_acctbal) "
        "FROM customer) THEN 1 ELSE 0 END) FROM customer GROUP BY c_segment"
    )
    staged = _split(sql)
    assert staged is not None

    def planned(v: float | None):
        return analyse(Asked(staged.filled([v]), {}, 0.5, 0.0), dataset, accountant)

    def shown(plan) -> list[dict]:  # the plan as the reply shows it, the SQL texts aside
        return [
            {k: v for k, v in entry.json().items() if k not in ("aggregate", "column")}
            for entry in summary(plan)
        ]

    stand_in, real = planned(STAND_IN), planned(value)
    assert real.cost == stand_in.cost
    assert shown(real) == shown(stand_in)


# -- the whole path on a real engine --------------------------------------------------


def _spent(engine: Engine, user: str) -> float:
    return engine.ledger.spent(user, "shop", "nb").epsilon


def test_a_value_released_first_is_what_the_query_compares_with(engine, folder):
    reply = engine.query("ann", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb"})
    ((stage,),) = [reply["stages"]]
    assert stage["sql"] == "SELECT AVG(c_acctbal) FROM customer"
    assert stage["epsilon"] == 0.5 and stage["replayed"] is False
    lo, hi = stage["interval"]
    assert lo <= stage["value"] <= hi
    # Charged the whole ε: the stage and the query, each its half, two debits.
    assert reply["cost"]["epsilon"] == pytest.approx(1.0)
    assert _spent(engine, "ann") == pytest.approx(1.0)
    # The query the gate released compares with exactly that value.
    history = engine.history("ann", "shop", "nb", 10)
    assert repr(float(stage["value"])) in str(history), history
    # The user's own text and whole budget are echoed.
    assert reply["request"]["sql"] == ABOVE and reply["request"]["epsilon"] == 1.0
    con = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    ((truth,),) = con.execute(
        f"SELECT COUNT(*) FROM customer WHERE c_acctbal > {stage['value']!r}"
    ).fetchall()
    ((count,),) = reply["rows"]
    assert abs(count - truth) <= 20  # ε 0.5 on a count of sensitivity 1: ±6 at 95%


def test_a_re_run_replays_every_stage_free(engine):
    first = engine.query("bob", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb"})
    again = engine.query("bob", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb"})
    assert again["replayed"] and again["stages"][0]["replayed"]
    assert again["rows"] == first["rows"]
    assert again["stages"][0]["value"] == first["stages"][0]["value"]
    assert _spent(engine, "bob") == pytest.approx(1.0)


def test_a_dry_run_shows_the_stages_and_their_cost_and_charges_nothing(engine):
    reply = engine.query("cat", {"sql": ABOVE, "epsilon": 1.0, "dry_run": True, "notebook": "nb"})
    assert reply["cost"]["epsilon"] == pytest.approx(1.0)
    assert reply["stages"] == [
        {"sql": "SELECT AVG(c_acctbal) FROM customer", "epsilon": 0.5, "delta": 0.0}
    ]
    assert _spent(engine, "cat") == 0.0


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT COUNT(*) FROM customer WHERE c_acctbal > "
         "(SELECT c_segment, COUNT(*) FROM customer GROUP BY c_segment)", "one value"),
        ("SELECT COUNT(*) FROM customer WHERE c_acctbal > (SELECT AVG(c_acctbal) FROM customer)"
         " GROUP BY c_custkey", "privacy unit"),
    ],
)  # fmt: skip
def test_a_stage_or_a_last_query_that_would_be_refused_is_refused_before_any_charge(
    engine, sql, says
):
    with pytest.raises(GateError, match=says):
        engine.query("dan", {"sql": sql, "epsilon": 1.0, "notebook": "nb"})
    assert _spent(engine, "dan") == 0.0


def _charged_as_told(engine: Engine, user: str, sql: str, epsilon: float) -> bool:
    """A staged query's invariant: the reply's cost, the ledger's charge and the ε
    asked are one number."""
    reply = engine.query(user, {"sql": sql, "epsilon": epsilon, "notebook": "nb"})
    told = reply["cost"]["epsilon"]
    return told == pytest.approx(epsilon) and _spent(engine, user) == pytest.approx(told)


def test_each_release_takes_its_share_and_a_broken_share_is_caught(engine, monkeypatch):
    """The broken version: each stage spending the whole ε (a staged release charged
    as if it were one release). The charge then exceeds what was asked, and the
    invariant, checked on the ledger, fails."""
    two = ABOVE.replace("FROM customer)", "FROM customer) + (SELECT MIN(c_acctbal) FROM customer)")
    assert _charged_as_told(engine, "eve", two, 1.5)
    monkeypatch.setattr(staged_releases, "shares", lambda stages: 1.0)
    assert not _charged_as_told(engine, "fay", two, 1.5)


def test_an_unqualified_column_of_the_query_around_ties_a_correlated_subquery(engine):
    """TPC-H query 17's shape: ``l_orderkey = o_orderkey`` names the query around it's
    column without a table: released per order, each of whose groups is one person's,
    so it is refused as a list of individuals, before anything is charged."""
    sql = (
        "SELECT COUNT(*) FROM orders WHERE o_total > "
        "(SELECT AVG(l_price) FROM lineitem WHERE l_orderkey = o_orderkey)"
    )
    with pytest.raises(GateError, match="each group of GROUP BY l_orderkey holds one person's"):
        engine.query("gus", {"sql": sql, "epsilon": 1.0, "notebook": "nb"})
    assert _spent(engine, "gus") == 0.0


@pytest.fixture
def tight(tmp_path: Path, folder: Path) -> Iterator[Engine]:
    """The shop with a notebook budget of ε 1.6: one staged query of ε 1 fits, two do
    not."""
    text = (folder / "shop.toml").read_text()
    text = text.replace(
        "notebook_budget = { epsilon = 1e6 }", "notebook_budget = { epsilon = 1.6 }"
    )
    text = text.replace(
        f'state_dir = "{(folder / "state").as_posix()}"', f'state_dir = "{tmp_path.as_posix()}"'
    )
    (tmp_path / "tight.toml").write_text(text)
    e = Engine(load_policy(tmp_path / "tight.toml"))
    yield e
    e.close()


def test_a_query_whose_stages_do_not_all_fit_is_refused_before_any_charge(tight):
    """The whole query's charge is checked before its first debit: the second query's
    first stage (ε 0.5) would fit, the whole (ε 1) does not, and nothing is charged. A
    re-run of the first is replayed, stages and all, on the budget that is left."""
    first = tight.query("ann", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb"})
    other = ABOVE.replace("AVG(c_acctbal)", "MEDIAN(c_acctbal)")
    with pytest.raises(OverBudget, match=r"needs ε=1 but only ε=0\.6 is left for notebook"):
        tight.query("ann", {"sql": other, "epsilon": 1.0, "notebook": "nb"})
    assert _spent(tight, "ann") == pytest.approx(1.0)
    again = tight.query("ann", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb"})
    assert again["replayed"] and again["rows"] == first["rows"]


def test_without_the_check_a_query_is_charged_for_stages_it_cannot_finish(tight, monkeypatch):
    """The broken version: stages charged one by one until one does not fit."""
    monkeypatch.setattr(Engine, "fits_all", lambda *a: None)
    tight.query("ann", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb"})
    other = ABOVE.replace("AVG(c_acctbal)", "MEDIAN(c_acctbal)")
    with pytest.raises(OverBudget):
        tight.query("ann", {"sql": other, "epsilon": 1.0, "notebook": "nb"})
    assert _spent(tight, "ann") == pytest.approx(1.5)  # its first stage, for nothing


def test_a_fresh_rerun_is_checked_for_all_its_releases(tight):
    """``fresh`` releases every stage again: none of them counts as a replay in the
    check before the first debit, so a fresh re-run that does not fit is refused
    whole (it would otherwise pay its first stage and be refused at its second)."""
    tight.query("ann", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb"})
    with pytest.raises(OverBudget):
        tight.query("ann", {"sql": ABOVE, "epsilon": 1.0, "notebook": "nb", "fresh": True})
    assert _spent(tight, "ann") == pytest.approx(1.0)
