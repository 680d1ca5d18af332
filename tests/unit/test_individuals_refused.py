"""A list or a top-k of persons (TPC-H's query 10: revenue per customer, the top 20)
is refused, saying why and what is answered instead, at no cost."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.pipeline import Asked, analyse
from tests.small_gate import write_policy


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT pid, SUM(age) AS total FROM t GROUP BY pid ORDER BY total DESC LIMIT 20",
        "SELECT pid, sex, COUNT(*) AS n FROM t GROUP BY pid, sex",
        "SELECT t.pid AS who, AVG(age) FROM t GROUP BY 1",
    ],
)
def test_a_top_k_of_persons_says_why_and_what_instead(tmp_path: Path, sql: str) -> None:
    (dataset,) = write_policy(tmp_path).datasets.values()
    with pytest.raises(Refused) as refused:
        analyse(Asked(sql=sql, params={}, epsilon=1.0, delta=0.0), dataset, PureAccountant())
    said = str(refused.value)
    assert "grouping by the privacy unit" in said
    assert "a list or top-k of individuals is never released" in said
    assert "top-k of public keys" in said
    assert "\n" not in said and len(said) < 300  # a refusal is one short line
