"""Accuracy first: ``accuracy=A`` buys the least cost at which every noisy cell's
(1 - alpha) interval is ±A, and the interval holds at its stated rate."""

from __future__ import annotations

import math
import textwrap

import pytest

from dpmagic.gate.dp.accounting import ZCDPAccountant
from dpmagic.gate.dp.calibration import Accuracy, Target, noise_for
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.mechanisms import calibrate, laplace_for_accuracy
from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import BadRequest, OverBudget, Refused
from dpmagic.gate.policy import load_policy
from tests.small_gate import write_policy

POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
accountant = "{accountant}"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = {budget}, delta = 1e-6 }}
query_default = {{ epsilon = 0.5 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""


@pytest.fixture(params=["pure", "zcdp"])
def engine(request, tmp_path):
    write_policy(tmp_path, rows=300)
    text = POLICY.format(accountant=request.param, budget=1000.0)
    (tmp_path / "policy.toml").write_text(textwrap.dedent(text))
    e = Engine(load_policy(tmp_path / "policy.toml"))
    yield e
    e.close()


def test_the_least_epsilon_that_gives_the_interval():
    """One notch less noise would still fit, one notch more would not: the scale is the
    widest whose interval is ±A, so its ε is the least (ε falls as the scale grows)."""
    for sensitivity, accuracy in ((1, 5.0), (4, 10.0), (200, 37.5)):
        noise = laplace_for_accuracy(sensitivity, accuracy, 0.05)
        assert noise.half_width(0.05) <= accuracy
        wider = calibrate(sensitivity, noise.epsilon * (1 - 1e-6))
        assert wider.half_width(0.05) > accuracy or wider.scale <= noise.scale


def test_a_plan_for_accuracy_costs_what_its_noise_costs(engine):
    reply = engine.query(
        "alice",
        {
            "sql": "SELECT sex, COUNT(*), SUM(age) FROM t GROUP BY sex",
            "accuracy": 50.0,
            "dry_run": True,
        },
    )
    steps = [s for s in reply["plan"] if s["kind"] != "output"]
    assert all(s["requested"]["half_width"] <= 50.0 for s in steps)
    assert all(s["requested"] == {**s["requested"], "accuracy": 50.0, "alpha": 0.05} for s in steps)
    if "rho" in reply["cost"]:
        assert reply["cost"]["rho"] == pytest.approx(sum(s["cost"]["rho"] for s in steps))
    else:
        assert reply["cost"]["epsilon"] == pytest.approx(sum(s["cost"]["epsilon"] for s in steps))
    # The sum needs more ε than the count: each measurement gets only what it needs.
    count, total = sorted(steps, key=lambda s: s["kind"])
    assert count["kind"] == "count" and total["kind"] == "sum"
    assert engine.budget("alice", None, "unnamed")["user"]["spent"]["epsilon"] == 0.0


# 150 fresh releases: under pure in the default run, under zCDP with the searches.
@pytest.mark.parametrize(
    "engine", ["pure", pytest.param("zcdp", marks=pytest.mark.search)], indirect=True
)
def test_accuracy_interval_holds_at_its_stated_rate(engine):
    """150 fresh releases of two counts at ±6 with alpha = 0.1: the true counts (150 and
    150) must fall in the interval at least 90% of the time. With a correct mechanism
    the miss rate is at most 10%; more than 17% misses out of 300 has probability
    below 1e-4 (binomial tail), so the test fails once in 10,000 runs."""
    misses = cells = 0
    body = {
        "sql": "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex",
        "accuracy": 6.0,
        "alpha": 0.1,
        "fresh": True,
    }
    for i in range(150):
        reply = engine.query("alice", {**body, "notebook": f"nb{i % 50}"})
        info = reply["accuracy"]["columns"][1]
        assert reply["accuracy"]["alpha"] == 0.1
        for _row, (lo, hi) in zip(reply["rows"], info["intervals"], strict=True):
            assert hi - lo <= 12.0
            cells += 1
            misses += not (lo <= 150 <= hi)
    assert misses / cells <= 0.17


def test_a_wrong_calibration_is_caught_by_the_same_rate():
    """Noise calibrated for alpha = 0.4 but reported at alpha = 0.1 misses far too often."""
    contribution = Contribution.bounded(1, 1, 2)
    loose = noise_for(
        1, 1, contribution, "add_remove", Target(ZCDPAccountant(), accuracy=Accuracy(6.0, 0.4))
    )
    draws = loose.sample(300)
    assert sum(abs(d) > 6 for d in draws) / 300 > 0.17


def test_accuracy_over_budget_is_refused_with_what_it_needs(tmp_path):
    write_policy(tmp_path)
    text = POLICY.format(accountant="pure", budget=0.5)
    (tmp_path / "policy.toml").write_text(textwrap.dedent(text))
    e = Engine(load_policy(tmp_path / "policy.toml"))
    try:
        with pytest.raises(OverBudget, match="needs ε="):
            e.query("alice", {"sql": "SELECT COUNT(*) FROM t", "accuracy": 1.0})
        assert e.budget("alice", None, None)["user"]["spent"]["epsilon"] == 0
    finally:
        e.close()


def test_accuracy_needs_cells_that_are_one_measurement(engine):
    with pytest.raises(Refused, match="COUNT and SUM; AVG"):
        engine.query("alice", {"sql": "SELECT AVG(age) FROM t", "accuracy": 5.0})
    with pytest.raises(BadRequest, match="not both"):
        engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "accuracy": 5.0, "epsilon": 1.0})
    with pytest.raises(BadRequest, match="alpha"):
        engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "accuracy": 5.0, "alpha": 1.5})
    assert math.isfinite(engine.budget("alice", None, None)["user"]["remaining"]["epsilon"])


def test_accuracy_refuses_aggregates_outside_the_outputs_too(engine):
    with pytest.raises(Refused, match="MEDIAN"):
        engine.query(
            "alice",
            {"sql": "SELECT COUNT(*) AS n FROM t HAVING MEDIAN(age) > 3", "accuracy": 5.0},
        )
    with pytest.raises(Refused, match="'n2' is not"):
        engine.query("alice", {"sql": "SELECT COUNT(*) * 2 AS n2 FROM t", "accuracy": 5.0})
