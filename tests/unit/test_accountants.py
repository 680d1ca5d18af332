"""The three accountants: composition, conversion to (ε, δ) through OpenDP, group
privacy, calibration against OpenDP's maps, and the ledger never overspending."""

from __future__ import annotations

import math
import textwrap
import threading

import opendp.prelude as dp
import pytest

from dpmagic.gate.dp.accounting import (
    AccountantError,
    ApproxAccountant,
    Cost,
    PureAccountant,
    ZCDPAccountant,
    compose,
    limit_rho,
    rho_for,
    rho_to_epsilon,
)
from dpmagic.gate.dp.mechanisms import GaussianNoise, calibrate_gaussian
from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import BadRequest, OverBudget
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Budget, PolicyError, load_policy, parse_policy
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.resolve import resolve
from tests.budgets import user_limits
from tests.gate_helpers import dataset
from tests.small_gate import write_policy

dp.enable_features("contrib", "honest-but-curious")


def opendp_epsilon(rho: float, delta: float) -> float:
    """OpenDP's zCDP → (ε, δ) conversion, built here independently of the gate."""
    meas = dp.m.make_user_measurement(
        dp.atom_domain(T=bool),
        dp.discrete_distance(),
        dp.zero_concentrated_divergence(),
        lambda x: x,
        lambda _: rho,
    )
    return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(meas), delta).map(1)[0]


# --- composition ---------------------------------------------------------------


def test_pure_costs_add_up():
    acc = PureAccountant()
    total = compose([acc.query_cost(0.1, 0)] * 10)
    assert total.epsilon == pytest.approx(1.0) and total.delta == 0
    assert acc.fits(compose([acc.query_cost(0.1, 0)] * 9), acc.query_cost(0.1, 0), Budget(1.0))
    assert not acc.fits(compose([acc.query_cost(0.1, 0)] * 10), acc.query_cost(0.1, 0), Budget(1.0))
    with pytest.raises(AccountantError):
        acc.query_cost(0.1, 1e-6)


def test_approx_adds_up_epsilon_and_delta():
    acc = ApproxAccountant()
    costs = [acc.query_cost(0.2, 1e-7)] * 5
    total = compose(costs)
    assert (total.epsilon, total.delta) == (pytest.approx(1.0), pytest.approx(5e-7))
    assert acc.fits(compose(costs[:4]), costs[0], Budget(1.0, 5e-7))
    # δ is a limit of its own: ε to spare does not buy δ.
    assert not acc.fits(compose(costs), acc.query_cost(0.01, 1e-7), Budget(10.0, 5e-7))
    # δ > 0 has no finite ρ: such a charge can never be counted as zCDP.
    assert math.isinf(costs[0].rho)
    assert acc.query_cost(0.2, 0).rho == pytest.approx(0.02)


def test_zcdp_adds_up_rho_and_beats_basic_composition():
    acc = ZCDPAccountant()
    one = acc.query_cost(0.5, 1e-6)
    total = compose([one] * 16)
    assert total.rho == pytest.approx(16 * one.rho)
    # Sixteen queries of ε=0.5 cost far less than the 8.0 basic composition states.
    shown = rho_to_epsilon(total.rho, 1e-6)
    assert shown < 0.5 * 16 / 2
    assert acc.fits(compose([one] * 15), one, Budget(shown * 1.0001, 1e-6))
    assert not acc.fits(compose([one] * 16), one, Budget(shown * 1.0001, 1e-6))


# --- conversion ------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-6), (1.0, 1e-6), (3.0, 1e-9), (0.5, 1e-3)])
def test_rho_for_is_the_tightest_rho_opendp_converts_within_budget(epsilon, delta):
    rho = rho_for(epsilon, delta)
    assert opendp_epsilon(rho, delta) <= epsilon * (1 + 1e-9)
    # One part in a million more ρ no longer fits: the search is tight.
    assert opendp_epsilon(rho * (1 + 1e-6), delta) > epsilon
    assert rho_to_epsilon(rho, delta) == pytest.approx(opendp_epsilon(rho, delta))


def test_rho_conversion_is_tighter_than_the_textbook_bound():
    """OpenDP's conversion is at least as tight as ρ + 2√(ρ ln 1/δ) (Bun–Steinke)."""
    for rho in (0.001, 0.05, 1.0):
        assert rho_to_epsilon(rho, 1e-6) <= rho + 2 * math.sqrt(rho * math.log(1e6))


def test_zcdp_budget_views_speak_epsilon_delta():
    acc = ZCDPAccountant()
    limit = Budget(1.0, 1e-6)
    one = acc.query_cost(0.25, 1e-6)
    view = acc.view(compose([one] * 4), limit)
    assert view["limit"]["rho"] == pytest.approx(limit_rho(limit))
    assert view["spent"]["rho"] == pytest.approx(4 * one.rho)
    assert view["spent"]["epsilon"] == pytest.approx(rho_to_epsilon(4 * one.rho, 1e-6))
    assert view["spent"]["epsilon"] < 1.0  # four quarter-ε queries: sublinear
    left = view["remaining"]
    assert left["rho"] == pytest.approx(limit_rho(limit) - 4 * one.rho)
    assert left["epsilon"] == pytest.approx(rho_to_epsilon(left["rho"], 1e-6))
    assert acc.view(Cost(0, 0, 0), limit)["spent"] == {"epsilon": 0, "delta": 0, "rho": 0}


def test_zcdp_needs_delta():
    with pytest.raises(AccountantError, match="delta > 0"):
        ZCDPAccountant().query_cost(1.0, 0.0)


# --- group privacy ---------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 4])
def test_group_privacy_scales_every_cost(k):
    pure = PureAccountant().group(PureAccountant().query_cost(0.3, 0), k)
    assert pure.epsilon == pytest.approx(k * 0.3)
    approx = ApproxAccountant().group(ApproxAccountant().query_cost(0.3, 1e-7), k)
    assert approx.epsilon == pytest.approx(k * 0.3)
    assert approx.delta == pytest.approx(k * math.exp((k - 1) * 0.3) * 1e-7)
    z = ZCDPAccountant()
    base = z.query_cost(0.3, 1e-6)
    grouped = z.group(base, k)
    assert grouped.rho == pytest.approx(k * k * base.rho)
    assert grouped.epsilon == pytest.approx(opendp_epsilon(k * k * base.rho, 1e-6))


GROUP_POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
accountant = "{accountant}"
group_size = {k}
user_budget = {{ epsilon = 50.0, delta = 1e-5 }}
query_default = {{ epsilon = 0.5, delta = {delta} }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""


def _engine(tmp_path, accountant: str, k: int, delta: float = 1e-7) -> Engine:
    write_policy(tmp_path)
    text = GROUP_POLICY.format(accountant=accountant, k=k, delta=delta)
    (tmp_path / "policy.toml").write_text(textwrap.dedent(text))
    return Engine(load_policy(tmp_path / "policy.toml"))


@pytest.mark.parametrize("accountant", ["pure", "approx", "zcdp"])
def test_group_size_scales_the_charge_but_not_the_noise(tmp_path, accountant):
    delta = 0.0 if accountant == "pure" else 1e-7
    costs, scales = {}, {}
    for k in (1, 3):
        engine = _engine(tmp_path / f"{accountant}{k}", accountant, k, delta)
        try:
            reply = engine.query(
                "alice", {"sql": "SELECT sex, COUNT(*) FROM t GROUP BY sex", "dry_run": True}
            )
        finally:
            engine.close()
        costs[k] = reply["cost"]
        scales[k] = reply["plan"][0]["scale"]
    assert scales[1] == scales[3]
    if accountant == "pure":
        assert costs[3]["epsilon"] == pytest.approx(3 * costs[1]["epsilon"])
    elif accountant == "approx":
        assert costs[3]["epsilon"] == pytest.approx(1.5)
        assert costs[3]["delta"] == pytest.approx(3 * math.exp(2 * 0.5) * 1e-7)
    else:
        assert costs[3]["rho"] == pytest.approx(9 * costs[1]["rho"])


# --- policy ----------------------------------------------------------------------


def _raw(**extra):
    return {
        "gate": {"accountant": "approx"},
        "datasets": {
            "d": {
                "sources": {"t": "t.csv"},
                "user_budget": {"epsilon": 1.0, "delta": 1e-6},
                "tables": {"t": {"columns": {"x": {"type": "int"}}}},
                **extra,
            }
        },
    }


def test_policy_chooses_the_accountant_per_dataset():
    from pathlib import Path

    assert parse_policy(_raw(), Path("p.toml")).dataset("d").accountant == "approx"
    ds = parse_policy(_raw(accountant="zcdp", group_size=2), Path("p.toml")).dataset("d")
    assert (ds.accountant, ds.group_size) == ("zcdp", 2)
    assert ds.as_dict()["accountant"] == "zcdp" and ds.as_dict()["group_size"] == 2
    with pytest.raises(PolicyError, match="accountant must be one of"):
        parse_policy(_raw(accountant="renyi"), Path("p.toml"))
    with pytest.raises(PolicyError, match="group_size must be a whole number"):
        parse_policy(_raw(group_size=1.5), Path("p.toml"))
    with pytest.raises(PolicyError, match="delta > 0"):
        parse_policy(_raw(accountant="zcdp", user_budget={"epsilon": 1.0}), Path("p.toml"))


# --- calibration against OpenDP ----------------------------------------------------


@pytest.mark.parametrize(("l2", "rho"), [(1.0, 0.5), (math.sqrt(3) * 4, 0.01), (2.5, 2.0)])
def test_gaussian_calibration_is_opendps_tightest(l2, rho):
    noise = calibrate_gaussian(l2, rho)
    independent = dp.m.make_gaussian(
        dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="f64"), scale=noise.scale
    )
    assert independent.map(l2) <= rho
    assert noise.scale == pytest.approx(l2 / math.sqrt(2 * rho), rel=1e-9)
    tighter = math.nextafter(math.nextafter(noise.scale, 0), 0) * (1 - 1e-12)
    assert GaussianNoise(l2, tighter).rho > rho or tighter <= 0


def test_zcdp_plans_gaussian_noise_within_the_asked_rho():
    ds = dataset(
        {
            "pid": {"type": "int"},
            "g": {"type": "int", "public_values": [0, 1, 2]},
            "x": {"type": "int", "lower": -3, "upper": 5},
        },
        max_partitions=2,
    )
    z = ZCDPAccountant()
    checked = check(resolve(parse("SELECT g, COUNT(*), SUM(x) FROM t GROUP BY g"), ds))
    p = plan(bound(checked), 1.0, 1e-6, z)
    assert {m.noise.mechanism for m in p.measurements} == {"discrete_gaussian"}
    assert sum(m.noise.rho for m in p.measurements) <= p.cost.rho * (1 + 1e-12)
    assert p.cost.rho == pytest.approx(rho_for(1.0, 1e-6))


# --- the ledger --------------------------------------------------------------------


def test_ledger_never_overspends_rho_under_racing_debits(tmp_path):
    acc = ZCDPAccountant()
    ledger = Ledger(tmp_path / "l.sqlite3", PureAccountant())
    limit = Budget(1.0, 1e-6)
    cost = acc.query_cost(0.2, 1e-6)
    outcomes: list[str] = []

    def spend():
        for _ in range(10):
            try:
                ledger.debit(
                    user="a",
                    dataset="d",
                    notebook="n",
                    cost=cost,
                    limits=user_limits("d", "a", "n", limit, limit),
                    sql="q",
                    replay_key=None,
                    accountant=acc,
                )
                outcomes.append("ok")
            except OverBudget as exc:
                outcomes.append(str(exc))

    threads = [threading.Thread(target=spend) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fits = math.floor(limit_rho(limit) / cost.rho + 1e-9)
    assert outcomes.count("ok") == fits
    assert ledger.spent("a", "d").rho <= limit_rho(limit) * (1 + 1e-9)
    refusal = next(o for o in outcomes if o != "ok")
    assert refusal.startswith("needs ρ=") and "is left" in refusal
    ledger.close()


def test_past_charges_stay_counted_when_the_accountant_changes(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite3", PureAccountant())
    pure, z = PureAccountant(), ZCDPAccountant()
    limit = Budget(1.0, 1e-6)
    ledger.debit(
        user="a",
        dataset="d",
        notebook="n",
        cost=pure.query_cost(0.2, 0),
        limits=user_limits("d", "a", "n", limit, limit),
        sql="q",
        replay_key=None,
    )
    spent = ledger.spent("a", "d")
    # ε = 0.2 pure is 0.02-zCDP: the zCDP accountant sees it.
    assert spent.rho == pytest.approx(0.02)
    assert z.view(spent, limit)["spent"]["rho"] == pytest.approx(0.02)
    # An approximate charge with δ > 0 has no zCDP bound: nothing more fits under zCDP.
    approx = ApproxAccountant().query_cost(0.1, 1e-7)
    ledger.debit(
        user="a",
        dataset="d",
        notebook="n",
        cost=approx,
        limits=user_limits("d", "a", "n", limit, limit),
        sql="q",
        replay_key=None,
        accountant=ApproxAccountant(),
    )
    with pytest.raises(OverBudget):
        ledger.debit(
            user="a",
            dataset="d",
            notebook="n",
            cost=z.query_cost(0.01, 1e-6),
            limits=user_limits("d", "a", "n", limit, limit),
            sql="q",
            replay_key=None,
            accountant=z,
        )
    ledger.close()


# --- end to end through the engine -----------------------------------------------------


def test_zcdp_query_is_charged_in_rho_and_shown_in_epsilon_delta(tmp_path):
    engine = _engine(tmp_path, "zcdp", 1)
    try:
        reply = engine.query("alice", {"sql": "SELECT sex, COUNT(*) FROM t GROUP BY sex"})
        assert reply["cost"]["epsilon"] == 0.5 and reply["cost"]["delta"] == 1e-7
        assert reply["cost"]["rho"] == pytest.approx(rho_for(0.5, 1e-7))
        assert reply["accuracy"]["columns"][1]["mechanism"] == "discrete_gaussian"
        user = reply["budget"]["user"]
        assert user["spent"]["rho"] == pytest.approx(reply["cost"]["rho"])
        assert user["spent"]["delta"] == 1e-5 and user["limit"]["epsilon"] == 50.0
        assert user["spent"]["epsilon"] == pytest.approx(rho_to_epsilon(user["spent"]["rho"], 1e-5))
        assert engine.schema(None)["accountant"] == "zcdp"
        with pytest.raises(BadRequest, match="delta"):
            engine.query("alice", {"sql": "SELECT COUNT(*) FROM t", "delta": 0.0})
    finally:
        engine.close()


def test_approx_gaussian_measurement_costs_its_share():
    """Under approx a measurement whose Gaussian interval is narrower takes Gaussian
    noise (here: a unit in up to 100 keys, whose L2 reach is a tenth of its L1); its
    cost is then the (ε, δ) share its ρ was fitted within."""
    ds = dataset(
        {
            "pid": {"type": "int"},
            "s": {"type": "str"},
            "x": {"type": "int", "lower": 0, "upper": 9},
        },
        max_partitions=100,
        max_rows=100,
    )
    checked = check(resolve(parse("SELECT s, COUNT(*), SUM(x) FROM t GROUP BY s"), ds))
    p = plan(bound(checked), 1.5, 3e-6, ApproxAccountant())
    assert {m.noise.mechanism for m in p.measurements} == {"discrete_gaussian"}
    for m in p.measurements:  # three shares: the count, the sum, the key selection
        assert m.cost.epsilon == pytest.approx(0.5) and m.cost.delta == pytest.approx(1e-6)
    assert p.cost.epsilon == pytest.approx(1.5) and p.cost.delta == pytest.approx(3e-6)
