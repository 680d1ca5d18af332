"""A row expression takes the checker's rules wherever it is evaluated on private rows:
in ``WHERE``, in a ``LEFT JOIN``'s condition, and in a semi-join's subquery (``IN``,
``EXISTS``). Before, the last two took only the work bound's prices and the totality
pass's ``TRY``, so ``CAST(o_priority AS INT)`` there was answered (as NULL on every
row) where ``WHERE`` refused it; this test fails on that version."""

from __future__ import annotations

import pytest

from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import load_policy
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.resolve import resolve
from tests import shop

PLACES = {
    "WHERE": "SELECT COUNT(*) FROM orders WHERE {cond}",
    "ON": "SELECT COUNT(*) FROM customer LEFT JOIN orders ON c_custkey = o_custkey AND {cond}",
    "IN (SELECT …)": (
        "SELECT COUNT(*) FROM customer WHERE c_custkey IN "
        "(SELECT o_custkey FROM orders WHERE {cond})"
    ),
    "EXISTS (…)": (
        "SELECT COUNT(*) FROM customer WHERE EXISTS "
        "(SELECT 1 FROM orders WHERE o_custkey = c_custkey AND {cond})"
    ),
}
BROKEN = {
    "CAST(o_priority AS INT) > 3": "CAST can fail on data",
    "o_priority = 5": "compares number with text",
    "o_total || 'x' = 'y'": "",  # a text made from a number: the rules decide alike
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("shop")
    (out / "shop.toml").write_text(shop.policy_text(out / "shop.duckdb", out / "state"))
    return load_policy(out / "shop.toml").dataset("shop")


def _verdict(sql: str, dataset) -> str:
    try:
        check(resolve(parse(sql), dataset))
    except Refused as exc:
        return exc.message.split(":")[0] if "compares" not in exc.message else exc.message
    return "answered"


@pytest.mark.parametrize("cond", list(BROKEN))
def test_every_place_takes_the_rules_of_where(dataset, cond: str) -> None:
    verdicts = {place: _verdict(sql.format(cond=cond), dataset) for place, sql in PLACES.items()}
    assert len(set(verdicts.values())) == 1, verdicts
    assert BROKEN[cond] in verdicts["WHERE"]
