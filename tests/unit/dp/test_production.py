"""The rules of ``dp/`` are the numbers production uses: for queries of every aggregate
kind planned under policies of several contribution bounds and both neighbouring
relations, each measurement's sensitivity (and each quantile's distance) is the rule's,
computed here from the policy's declared bounds alone, never read back from the plan.

The brute-force tests beside this file prove the rules; these tie them to the plans,
in well under a second, so a production path that stops calling a rule (or calls it
with other bounds) fails here, not only in the slow pipeline searches. A deliberately
broken production count is caught, and a plan whose parts cost more than its charge
is refused (the last tests)."""

from __future__ import annotations

import math

import pytest

from dpmagic.gate.dp import calibration
from dpmagic.gate.dp.accounting import ZCDPAccountant
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.counts import count_sensitivity
from dpmagic.gate.dp.quantiles import selection_distance
from dpmagic.gate.dp.sums import sum_sensitivity
from dpmagic.gate.policy import Neighbouring
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import parts_spent, plan
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import dataset, make_plan

KEYS = [0, 1, 2]
BOUNDS = [(1, 1), (2, 3), (3, 4)]
RELATIONS = [Neighbouring.ADD_REMOVE, Neighbouring.SUBSTITUTE]


def _plan(sql: str, groups: int, rows: int, relation: Neighbouring) -> Plan:
    ds = dataset(
        {
            "pid": {"type": "int"},
            "g": {"type": "int", "public_values": KEYS},
            "x": {"type": "int", "lower": -5, "upper": 20},
        },
        max_partitions=groups,
        max_rows=rows,
        neighbouring=relation.value,
    )
    return make_plan(sql, ds)


def _declared(groups: int, rows: int) -> Contribution:
    """What the policy lets one unit bring to a query of one table grouped by ``g``: the
    load-time ranks keep ``K = min(groups, keys)·rows`` of its rows, which may all fall
    in one group (docs/privacy.md)."""
    return Contribution.bounded(1, min(groups, len(KEYS)) * rows, len(KEYS))


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize(("groups", "rows"), BOUNDS)
def test_counts_are_noised_at_the_count_rule(groups, rows, relation):
    p = _plan(
        "SELECT g, COUNT(*) AS n, COUNT(x) AS m, COUNT(DISTINCT x) AS d FROM t GROUP BY g",
        groups, rows, relation,
    )  # fmt: skip
    expected = count_sensitivity(_declared(groups, rows), relation)
    kinds = {m.kind for m in p.measurements}
    assert kinds == {MeasureKind.COUNT, MeasureKind.COUNT_DISTINCT}
    assert all(m.noise.sensitivity == expected for m in p.measurements)


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize(("groups", "rows"), BOUNDS)
def test_sums_are_noised_at_the_sum_rule(groups, rows, relation):
    p = _plan("SELECT g, SUM(x) AS s FROM t GROUP BY g", groups, rows, relation)
    (m,) = p.measurements
    lo, hi = m.grid_range
    assert (lo, hi) == (-5, 20)  # integers: the declared bounds are the grid's
    assert m.noise.sensitivity == sum_sensitivity(lo, hi, _declared(groups, rows), relation)


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize(("groups", "rows"), BOUNDS)
def test_an_averages_parts_follow_the_sum_and_count_rules(groups, rows, relation):
    p = _plan("SELECT g, AVG(x) AS a FROM t GROUP BY g", groups, rows, relation)
    c = _declared(groups, rows)
    by_kind = {m.kind: m for m in p.measurements}
    count, total = by_kind[MeasureKind.COUNT], by_kind[MeasureKind.SUM]
    assert count.noise.sensitivity == count_sensitivity(c, relation)
    # the centred sum's terms lie in the noise's own bounds, [lo, hi] below
    lo = total.centre.per_grid * min(-5, 0) - total.centre.units
    hi = total.centre.per_grid * max(20, 0) - total.centre.units
    assert total.noise.sensitivity == sum_sensitivity(lo, hi, c, relation)


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize(("groups", "rows"), BOUNDS)
def test_quantiles_are_chosen_at_the_distance_rule(groups, rows, relation):
    p = _plan("SELECT g, MEDIAN(x) AS q FROM t GROUP BY g", groups, rows, relation)
    (s,) = p.selections
    assert s.noise.distance == selection_distance(_declared(groups, rows), relation)


def test_a_production_count_that_stops_calling_its_rule_is_caught(monkeypatch):
    """The count's noise computed as a sum of values in ``[0, 1]`` (a rule that forgets
    a unit's rows can only add): the first test above fails."""

    def broken(contribution, neighbouring, target):
        one_row = Contribution(contribution.groups, 1, contribution.partitions)
        return calibration.noise_for(0, 1, one_row, neighbouring, target)

    monkeypatch.setattr("dpmagic.gate.sql.plan.count_noise_for", broken)
    with pytest.raises(AssertionError):
        test_counts_are_noised_at_the_count_rule(2, 3, Neighbouring.ADD_REMOVE)


@pytest.mark.parametrize("relation", RELATIONS)
def test_every_plan_composes_to_its_charge_and_one_that_does_not_is_refused(relation, monkeypatch):
    """Each plan above passed ``dp/composition.composes``; one whose weighted shares are handed
    out unweighted (each part a full share) spends more than it charges, and is
    refused as the gate's own bug before anything runs."""
    sql = "SELECT g, COUNT(*) AS n, AVG(x) AS a, MEDIAN(x) AS q FROM t GROUP BY g"
    p = _plan(sql, 2, 3, relation)
    spent = math.fsum(c.epsilon for c in parts_spent(p.measurements, p.selections, None, None))
    assert spent == pytest.approx(p.unit_cost.epsilon, rel=1e-6)
    monkeypatch.setattr("dpmagic.gate.sql.plan._target", lambda target, *a: target)
    with pytest.raises(RuntimeError, match="cost more than its charge"):
        _plan(sql, 2, 3, relation)


def test_a_zcdp_plan_at_a_huge_epsilon_composes_in_rho():
    """The Spark agreement suite asks at ε = 10^6 under zCDP: the check adds up ρ and
    never turns it back into ε (that conversion overflows there)."""
    ds = dataset({"pid": {"type": "int"}, "x": {"type": "int", "lower": 0, "upper": 10}})
    bounded = bound(check(resolve(parse("SELECT COUNT(*), AVG(x), MEDIAN(x) FROM t"), ds)))
    p = plan(bounded, 1e6, 1e-6, ZCDPAccountant())
    spent = math.fsum(c.rho for c in parts_spent(p.measurements, p.selections, None, None))
    assert spent == pytest.approx(p.unit_cost.rho, rel=1e-6)
