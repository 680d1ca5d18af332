"""The rules of ``dp/`` are the numbers production uses: for queries of every aggregate
kind planned under policies of several contribution bounds and both neighbouring
relations, each measurement's sensitivity (and each quantile's distance) is the rule's,
computed here from the policy's declared bounds alone, never read back from the plan.

The brute-force tests beside this file prove the rules; these tie them to the plans,
in well under a second, so a production path that stops calling a rule (or calls it
with other bounds) fails here, not only in the slow pipeline searches. A deliberately
broken production count is caught, and a plan whose parts cost more than its charge
is refused.

The inputs production hands the rules are decided in ``dp/`` too, and pinned below
against derivations of their own, each with a production plan (or the ledger's tally)
read against the same derivation:

1. the partition count sensitivities assume for keys chosen from the data
   (``partition_selection.chosen_key_partitions``, called by ``sql/plan.py``): a brute
   force over one key more than a unit and its replacement can reach;
2. what a unit brings to ``COUNT(DISTINCT unit)`` (``counts.distinct_units``, called by
   ``sql/plan.py``): a brute force over units of any rows in the partitions they reach;
3. what each bounding lets a unit contribute (``enforcement``, called by ``sql/ranks.py``):
   a brute force over every unit row level, the ranks and the window leave, in L1 and
   squared L2 under both relations;
4. how budgets add up across queries (``accounting.Composition``, which the ledger's
   tallies in ``ledger/scopes.py`` and ``compose`` both use): exact rational sums.

The last test breaks each in ``dp/`` (one partition fewer, one partition for a distinct
unit, one row or one group short, the largest charge for the sum) and sees the tests
above fail."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from dpmagic.gate.dp import accounting, calibration, counts, enforcement, partition_selection
from dpmagic.gate.dp.accounting import ApproxAccountant, Cost, ZCDPAccountant
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.counts import count_sensitivity
from dpmagic.gate.dp.quantiles import selection_distance
from dpmagic.gate.dp.sums import sum_l2_squared, sum_sensitivity
from dpmagic.gate.ledger.scopes import GRANTED, Tally
from dpmagic.gate.policy import Budget, Neighbouring
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import parts_spent, plan
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.ranks import Window
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import dataset, make_plan
from tests.unit.dp.brute import Unit, units

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


# The last four inputs, each decided by a rule of ``dp/`` and pinned here against a
# derivation of its own: a brute force over every unit the bounds leave on a few
# partitions (both relations, L1 and squared L2), or exact rational arithmetic.


def _l1(a: tuple, b: tuple | None) -> int:
    b = (0,) * len(a) if b is None else b
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def _l2_squared(a: tuple, b: tuple | None) -> int:
    b = (0,) * len(a) if b is None else b
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))


def _brute(every: list[Unit], measure) -> dict[str, tuple[int, int]]:
    """The worst change, ``(add_remove, substitute)`` in L1 and in squared L2, of the
    per-partition ``measure`` of one unit among ``every`` unit the bounds leave."""
    seen = sorted({tuple(measure(cell) for cell in u) for u in every})
    out = {}
    for name, change in (("l1", _l1), ("l2", _l2_squared)):
        add_remove = max(change(u, None) for u in seen)
        substitute = max(change(a, b) for a in seen for b in seen)
        out[name] = (add_remove, substitute)
    return out


def _rule(lo: int, hi: int, c: Contribution) -> dict[str, tuple[int, int]]:
    """What ``dp/sums`` claims for values in ``[lo, hi]`` (counts: ``[1, 1]``) under ``c``."""
    return {
        name: tuple(rule(lo, hi, c, relation) for relation in RELATIONS)
        for name, rule in (("l1", sum_sensitivity), ("l2", sum_l2_squared))
    }


SUMS = [(len, 1, 1, (1,)), (sum, -1, 2, (-1, 2))]  # counts, and sums of values in [-1, 2]


# 1. The partition count assumed for keys chosen from the data.


@pytest.mark.parametrize(("measure", "lo", "hi", "values"), SUMS)
@pytest.mark.parametrize(("groups", "rows"), [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)])
def test_chosen_keys_are_assumed_as_many_as_no_overlap_needs(groups, rows, measure, lo, hi, values):
    """Keys from the data are any keys: over one key more than two units can reach,
    every unit of at most ``groups`` keys and ``rows`` rows in each moves the counts and
    sums as ``dp/sums`` says at the partition count ``chosen_key_partitions`` assumes
    (a count one below it lets a replacement claim a key shared it need not share)."""
    keys = 2 * groups + 1
    assumed = partition_selection.chosen_key_partitions(groups)
    expected = _brute(list(units(keys, groups, rows, values)), measure)
    assert _rule(lo, hi, Contribution.bounded(groups, rows, assumed)) == expected


@pytest.mark.parametrize("relation", RELATIONS)
def test_a_plan_of_chosen_keys_is_noised_for_keys_no_one_shares(relation):
    """The production plan (keys chosen by partition selection, the window's ``2 × 2``)
    against the brute force over five keys, more than two units reach."""
    ds = dataset(
        {"pid": {"type": "int"}, "k": {"type": "str"},
         "x": {"type": "int", "lower": -1, "upper": 2}},
        max_partitions=2, max_rows=2, neighbouring=relation.value,
    )  # fmt: skip
    sql = "SELECT k, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY k"
    p = plan(bound(check(resolve(parse(sql), ds))), 1.0, 1e-6, ApproxAccountant())
    assert p.key_selection is not None and isinstance(p.bounding, Window)
    at = RELATIONS.index(relation)
    for m in p.measurements:
        measure, *_, values = SUMS[1] if m.kind == MeasureKind.SUM else SUMS[0]
        worst = _brute(list(units(5, 2, 2, values)), measure)["l1"][at]
        assert m.noise.sensitivity == worst


# 2. What a unit brings to COUNT(DISTINCT unit).


@pytest.mark.parametrize(("partitions", "groups", "rows"), [
    (p, g, r) for p in (1, 2, 3) for g in range(1, p + 1) for r in (1, 2, 3)
])  # fmt: skip
def test_a_unit_counts_once_in_each_partition_it_reaches(partitions, groups, rows):
    """However many rows a unit has in a partition, it is one distinct unit there, in
    each of at most ``groups`` partitions."""
    c = Contribution.bounded(groups, rows, partitions)
    every = list(units(partitions, groups, rows, (1, 2)))
    expected = _brute(every, lambda cell: int(bool(cell)))
    assert _rule(1, 1, counts.distinct_units(c)) == expected


@pytest.mark.parametrize("relation", RELATIONS)
def test_a_plans_count_of_distinct_units_is_noised_at_one_per_partition(relation):
    """The production plan over three public keys, two of which one unit may reach,
    against the brute force over units of any rows there."""
    p = _plan("SELECT g, COUNT(DISTINCT pid) AS u FROM t GROUP BY g", 2, 3, relation)
    (m,) = p.measurements
    assert m.kind == MeasureKind.COUNT_UNIT
    every = list(units(len(KEYS), 2, 3, (1, 2)))
    worst = _brute(every, lambda cell: int(bool(cell)))["l1"][RELATIONS.index(relation)]
    assert m.noise.sensitivity == worst


# 3. What each bounding lets a unit contribute.


def _ranked_units(partitions: int, rows: int, values: tuple[int, ...]) -> list[Unit]:
    """What the load-time ranks leave of a unit: at most ``rows`` rows, anywhere."""
    return [u for u in units(partitions, partitions, rows, values) if sum(map(len, u)) <= rows]


ENFORCED = [
    ("row level", lambda p, g, r: enforcement.row_level(p), lambda p, g, r, v: units(p, 1, 1, v)),
    ("ranks", lambda p, g, r: enforcement.ranked(r, p), lambda p, g, r, v: _ranked_units(p, r, v)),
    ("window", lambda p, g, r: enforcement.window(g, r, p), lambda p, g, r, v: units(p, g, r, v)),
]


@pytest.mark.parametrize(("measure", "lo", "hi", "values"), SUMS)
@pytest.mark.parametrize(("partitions", "groups", "rows"),
                         [(1, 1, 2), (2, 1, 2), (2, 2, 2), (3, 2, 1), (3, 2, 3)])  # fmt: skip
@pytest.mark.parametrize(("name", "rule", "left"), ENFORCED, ids=[e[0] for e in ENFORCED])
def test_each_bounding_contributes_what_the_units_it_leaves_can_move(
    name, rule, left, partitions, groups, rows, measure, lo, hi, values
):
    """``dp/enforcement``'s map against every unit each bounding leaves: row level one
    row; the ranks ``rows`` rows in any partitions; the window ``rows`` rows in each of
    ``groups`` partitions. Their counts and sums move exactly as the map's contribution
    says, in L1 and squared L2, under both relations."""
    expected = _brute(list(left(partitions, groups, rows, values)), measure)
    assert _rule(lo, hi, rule(partitions, groups, rows)) == expected


# 4. How budgets add up across queries.

CHARGES = [
    Cost(0.1, 0.0, 0.005), Cost(0.1, 1e-7, math.inf), Cost(1e-12, 0.0, 5e-25),
    Cost(3.0, 1e-9, 4.5), Cost(0.1, 0.0, 0.005), Cost(2.0**-60, 2.0**-80, 2.0**-121),
    Cost(0.7, 0.0, 0.245), Cost(1e6, 0.0, 5e11),
]  # fmt: skip


def _exact(charges: list[Cost]) -> Cost:
    """Each amount's exact rational sum, rounded once (a non-finite one stays so)."""

    def total(values: list[float]) -> float:
        if not all(map(math.isfinite, values)):
            return math.inf
        return float(sum(map(Fraction, values), Fraction(0)))

    return Cost(*(total([getattr(c, a) for c in charges]) for a in ("epsilon", "delta", "rho")))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_budgets_add_up_every_charge_exactly(n):
    """``Composition``, as the ledger's tallies add charges up one by one and ``compose``
    within a query, is each amount's exact sum rounded once, in any order: ten charges
    of 0.1 spend ``fsum`` of them, no charge is forgotten or taken for the largest."""
    charges = (CHARGES * 2)[:n]
    running = accounting.Composition()
    for charge in charges:
        running.add(charge)
    assert running.total() == _exact(charges)
    assert accounting.compose(reversed(charges)) == _exact(charges)
    tenth = accounting.compose([Cost(0.1)] * 10)
    assert tenth.epsilon == math.fsum([0.1] * 10) == float(Fraction(0.1) * 10)


def test_a_scopes_tally_spends_and_grants_by_that_composition():
    """The ledger's tally of one scope (``ledger/scopes.Tally``), fed the rows of
    charges and grants, stands at the exact sums: its spending is the charges composed,
    its limit the policy's plus every grant."""
    tally = Tally()
    for c in CHARGES:
        tally.spend({"epsilon": c.epsilon, "delta": c.delta, "rho": c.rho})
    for grant in (0.1, 0.2, 0.3):
        tally.admin({"status": GRANTED, "epsilon": grant, "delta": grant * 1e-6})
    assert tally.spent() == _exact(CHARGES)
    granted = _exact([Cost(g, g * 1e-6) for g in (0.1, 0.2, 0.3)])
    limit = tally.limit(Budget(1.0, 1e-6))
    assert (limit.epsilon, limit.delta) == (1.0 + granted.epsilon, 1e-6 + granted.delta)


# Each of the four decisions, broken in ``dp/``, is caught by the tests above.


def _mutations():
    """Each decision off by one (or its sum taken for a maximum), as
    ``(target, replacement, the tests that must then fail)``."""

    def fewer_keys(groups):
        return 2 * groups - 1

    def one_partition(c):
        return Contribution(1, 1, c.partitions)

    def ranked_short(rows, partitions):
        return Contribution.bounded(1, rows - 1 or 1, partitions)

    def window_short(groups, rows, partitions):
        return Contribution.bounded(max(groups - 1, 1), rows, partitions)

    def largest(self, value):
        if math.isfinite(value):
            self._exact = max(self._exact, Fraction(value))
        else:
            self._special.add(value)

    return {
        "partition count one less": (
            [
                ("dpmagic.gate.dp.partition_selection.chosen_key_partitions", fewer_keys),
                ("dpmagic.gate.sql.plan.chosen_key_partitions", fewer_keys),
            ],
            [
                lambda: test_chosen_keys_are_assumed_as_many_as_no_overlap_needs(2, 1, *SUMS[0]),
                lambda: test_a_plan_of_chosen_keys_is_noised_for_keys_no_one_shares(
                    Neighbouring.SUBSTITUTE
                ),
            ],
        ),
        "a distinct unit in one partition": (
            [
                ("dpmagic.gate.dp.counts.distinct_units", one_partition),
                ("dpmagic.gate.sql.plan.distinct_units", one_partition),
            ],
            [
                lambda: test_a_unit_counts_once_in_each_partition_it_reaches(2, 2, 1),
                lambda: test_a_plans_count_of_distinct_units_is_noised_at_one_per_partition(
                    Neighbouring.ADD_REMOVE
                ),
            ],
        ),
        "the ranks one row short": (
            [("dpmagic.gate.dp.enforcement.ranked", ranked_short)],
            [
                lambda: test_each_bounding_contributes_what_the_units_it_leaves_can_move(
                    "ranks", *ENFORCED[1][1:], 2, 1, 2, *SUMS[0]
                ),
                lambda: test_counts_are_noised_at_the_count_rule(2, 3, Neighbouring.ADD_REMOVE),
            ],
        ),
        "the window one group short": (
            [("dpmagic.gate.dp.enforcement.window", window_short)],
            [
                lambda: test_each_bounding_contributes_what_the_units_it_leaves_can_move(
                    "window", *ENFORCED[2][1:], 2, 2, 2, *SUMS[0]
                ),
                lambda: test_a_plans_count_of_distinct_units_is_noised_at_one_per_partition(
                    Neighbouring.ADD_REMOVE
                ),
            ],
        ),
        "budgets composed by their largest charge": (
            [("dpmagic.gate.dp.accounting._ExactSum.add", largest)],
            [
                lambda: test_budgets_add_up_every_charge_exactly(3),
                test_a_scopes_tally_spends_and_grants_by_that_composition,
            ],
        ),
    }


@pytest.mark.parametrize("name", list(_mutations()))
def test_each_decision_broken_in_dp_is_caught(name, monkeypatch):
    """The checks above hold of the rules as they are (run here first), and each fails
    once its rule is broken in ``dp/``: the rule's own test and the production one."""
    patches, checks = _mutations()[name]
    for check_ in checks:
        check_()
    for target, replacement in patches:
        monkeypatch.setattr(target, replacement)
    for check_ in checks:
        with pytest.raises(AssertionError):
            check_()
