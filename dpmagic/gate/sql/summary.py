"""A plan as the dry run and every reply show it: per noisy aggregate its bounds,
sensitivity, mechanism, scale, cost and expected error, and where the group keys
come from; then per output column its expected 95% error in its own units (at
stated group sizes where it depends on them) and the group size under which noise
dominates it by the rule of ``dominance``. All of it is public: a function of the
query and the policy alone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from sqlglot import exp

from dpmagic.gate.dp.accounting import Cost
from dpmagic.gate.dp.levels import EDGE_PART_ALPHA, REPORT_ALPHA
from dpmagic.gate.dp.quantile_selection import QuantileNoise, calibrate_quantile
from dpmagic.gate.sql.aggregates.parts import Parts
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.dominance import (
    DOMINANT_SHARE,
    Bare,
    affine_factor,
    judging_rule,
    quantile_count,
)
from dpmagic.gate.sql.keys import KeyDomain
from dpmagic.gate.sql.plan_types import Edges, Measurement, Plan, Selection
from dpmagic.gate.sql.trees import display
from dpmagic.protocol import Band, BandAt, Contribution, ErrorAt, PlanKey, PlanStep, Requested
from dpmagic.protocol import Cost as ProtocolCost

GROUP_SIZES = (100, 1000)
"""The group sizes an output's error is stated at where it depends on the group's size."""


def summary(the_plan: Plan) -> list[PlanStep]:
    """The plan per measurement, all of it public: bounds, sensitivity, mechanism,
    scale, cost, the expected 95% error, and where the group keys come from."""
    keys = [
        PlanKey(
            column=k.label,
            public=d.private is None,
            values=None if d.private else len(d.values),
            source=_key_source(d),
        )
        for k, d in zip(the_plan.keys, the_plan.domains, strict=True)
    ]
    partitions = None if the_plan.key_selection else len(the_plan.partitions)
    bounds = Contribution(groups=the_plan.contribution.groups, rows=the_plan.contribution.rows)
    steps = []
    for m in the_plan.measurements:
        step = PlanStep(
            aggregate=m.label,
            kind=m.kind.value,
            bounds=None if m.clamp is None else [m.clamp.lo, m.clamp.hi],
            sensitivity=m.sensitivity,
            norm="L2" if m.noise.mechanism.endswith("gaussian") else "L1",
            mechanism=m.noise.mechanism,
            scale=m.scale,
            epsilon=m.cost.epsilon,
            cost=stated_cost(m.cost),
            accuracy=m.noise.half_width(REPORT_ALPHA),
            partitions=partitions,
            keys=keys,
            contribution=bounds,
        )
        if the_plan.accuracy is not None:
            step.requested = Requested(
                accuracy=the_plan.accuracy.half_width,
                alpha=the_plan.accuracy.alpha,
                half_width=m.noise.half_width(the_plan.accuracy.alpha),
            )
        steps.append(step)
    return (
        steps
        + [
            PlanStep(
                aggregate=s.label,
                kind="quantile",
                bounds=[s.grid.lo, s.grid.hi],
                sensitivity=s.sensitivity,
                norm="symmetric",
                mechanism=s.noise.mechanism,
                scale=s.scale,
                epsilon=s.epsilon,
                cost=ProtocolCost(epsilon=s.epsilon, delta=0.0),
                candidates=s.grid.size,
                # A quantile's accuracy is in ranks: how far, at 95%, the released
                # value's rank may lie from the level's, whatever the data.
                level=s.noise.level,
                rank_radius=s.noise.rank_radius(REPORT_ALPHA),
                partitions=partitions,
                keys=keys,
                contribution=bounds,
            )
            for s in the_plan.selections
        ]
        + [_edges_step(s, s.edges, partitions, keys) for s in the_plan.selections if s.edges]
        + _key_selection_step(the_plan, keys, bounds)
        + output_steps(the_plan)
    )


def edge_noise(s: Selection, edges: Edges) -> QuantileNoise:
    """The mechanism of a quantile's interval ends as at its own level (``edges``; at
    the levels they are chosen at, from the count, it differs a little)."""
    return calibrate_quantile(s.noise.level, s.grid.size, s.noise.distance, edges.epsilon)


def edge_radius(s: Selection, edges: Edges) -> float:
    """The rank radius of a quantile's interval ends (``edge_noise``), at
    ``levels.EDGE_PART_ALPHA`` each."""
    return edge_noise(s, edges).rank_radius(EDGE_PART_ALPHA)


def _edges_step(
    s: Selection, edges: Edges, partitions: int | None, keys: list[PlanKey]
) -> PlanStep:
    """The two selections that make a quantile's interval in the column's units."""
    return PlanStep(
        aggregate=f"{s.label}: its interval's ends",
        kind="quantile_interval",
        bounds=[s.grid.lo, s.grid.hi],
        sensitivity=s.sensitivity,
        norm="symmetric",
        mechanism=s.noise.mechanism,
        epsilon=2 * edges.epsilon,
        cost=ProtocolCost(epsilon=2 * edges.epsilon, delta=0.0),
        candidates=s.grid.size,
        level=s.noise.level,
        scale=edge_noise(s, edges).scale,
        rank_radius=edge_radius(s, edges),
        partitions=partitions,
        keys=keys,
    )


def output_steps(the_plan: Plan) -> list[PlanStep]:
    """Per output column computed from noisy aggregates, of kind ``output``: the
    ``rule`` it is judged by (and its ``range``), its expected 95% error in its own
    units (``half_width`` where it does not depend on the group, else
    ``half_width_at`` per group size in ``GROUP_SIZES``; a quantile's, whose width
    in units depends on how the values spread, as the group's percentiles its
    interval spans, ``percentiles_at``), and ``dominated_below``: the group
    size under which noise can dominate it, at the least favourable values its
    bounds allow (``None`` where no size says it: a sum whose bounds reach 0, at
    any size near 0; an expression of several aggregates).
    """
    steps = []
    for out in the_plan.checked.outputs:
        names = {n.name for n in out.expr.walk() if isinstance(n, exp.Column)}
        used = [n for n in names if n in the_plan.parts]
        if not used:
            continue
        kind, what = judging_rule(the_plan, out.expr)
        steps.append(
            PlanStep(
                kind="output",
                column=out.name,
                aggregate=_shown(the_plan, out.expr),
                rule=kind,
                range=list(what[:2]) if kind == "range" else None,  # type: ignore[index]
                **vars(_expected(the_plan, out.expr, used, kind, what)),
            )
        )
    return steps


def _shown(the_plan: Plan, node: exp.Expression) -> str:
    """An output as the user wrote it: each aggregate and key by its own text."""
    labels = {a.name: a.label for a in the_plan.checked.aggregates}
    labels.update({k.name: k.label for k in the_plan.keys})

    def text(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.name in labels:
            return exp.Var(this=labels[n.name])
        return n

    return display(node.copy().transform(text))


@dataclass(frozen=True)
class Expected:
    """An output's expected 95% error, by one of ``half_width`` (not depending on the
    group's size), ``half_width_at`` (at ``GROUP_SIZES``) or a quantile's
    ``percentiles_at`` (with the ``count`` it is judged by), and the group size under
    which noise dominates it: the fields of its ``PlanStep`` of kind ``output``."""

    half_width: float | None = None
    half_width_at: list[ErrorAt] | None = None
    percentiles_at: list[BandAt] | None = None
    count: str | None = None
    dominated_below: int | None = None


def _expected(
    the_plan: Plan, node: exp.Expression, used: list[str], kind: str, what: object
) -> Expected:
    """An output's expected 95% error and the size under which noise dominates it."""
    alpha = REPORT_ALPHA
    if kind == "percentiles":
        s: Selection = what  # type: ignore[assignment]
        count = quantile_count(the_plan, s)
        radius = s.noise.rank_radius(alpha)
        q = s.noise.level
        # Its interval's ends lie within their own radius of levels their radius away
        # from q (``edges``): the interval spans the percentiles about twice that away.
        span = radius if s.edges is None else 2 * edge_radius(s, s.edges)
        bands = [
            BandAt(rows=n, band=Band(lower=max(0.0, q - span / n), upper=min(1.0, q + span / n)))
            for n in GROUP_SIZES
        ]
        # The band covers half the group once radius/n reaches this share.
        reach = 0.25 if min(q, 1 - q) >= 0.25 else DOMINANT_SHARE - min(q, 1 - q)
        below = _rows_below(radius / reach)
        if s.edges is not None and 0 < q < 1:
            # Below about r_e/min(q, 1 − q) values an end's level cannot fit between 0
            # and q (or q and 1): it falls back to the grid's end, and an interval
            # from a bound is judged by its range (``dominance``) and flagged.
            below = max(below, _rows_below(edge_radius(s, s.edges) / min(q, 1 - q)))
        return Expected(
            percentiles_at=bands,
            dominated_below=below,
            count=None if count is None else count.label,
        )
    scale = affine_factor(node)
    if len(used) != 1 or scale is None:
        return Expected()
    name = used[0]
    parts = the_plan.parts[name]
    return _aggregate_expected(the_plan, name, parts, abs(scale), node, kind, what)


def _aggregate_expected(
    the_plan: Plan,
    name: str,
    parts: Parts,
    scale: float,
    node: exp.Expression,
    kind: str,
    what: object,
) -> Expected:
    """The expected 95% error of an output that is one aggregate, scaled by ``scale``
    (rounded, cast or with constants added): the error its kind expects per group size
    (``Aggregate.expected``), or a bare count's or sum's measurement's own interval."""
    alpha = REPORT_ALPHA
    aggregate = kind_of(the_plan.checked.aggregate(name).func)
    expected = aggregate.expected(the_plan, name, parts)
    if expected is not None:
        error, of, root = expected
        return _per_rows(scale * error(the_plan, of, alpha), kind, what, square_root=root)
    rule, bare = aggregate.dominance(the_plan, name, parts)
    if rule != "zero" or bare is None:  # its accuracy is known only once it has run
        return Expected()
    m, _ = cast(Bare, bare)
    half = scale * (m.noise.half_width(alpha) if m.noise.sensitivity else 0.0)
    return Expected(half_width=half, dominated_below=_zero_below(m, half, node))


def _per_rows(error: float, kind: str, what: object, square_root: bool) -> Expected:
    """An error of ``error / n`` for a group of ``n`` rows (a standard deviation's: at most
    the square root of its variance's, ``|√a − √b| ≤ √|a − b|``), at ``GROUP_SIZES``; and
    where its interval reaches ``DOMINANT_SHARE`` of the range."""

    def at(n: float) -> float:
        return math.sqrt(error / n) if square_root else error / n

    below = None
    if kind == "range":
        lo, hi = what[:2]  # type: ignore[index]
        target = DOMINANT_SHARE * (hi - lo) / 2  # the half-width that covers that share
        if target > 0:
            below = _rows_below(error / target**2 if square_root else error / target)
    errors = [ErrorAt(rows=n, half_width=at(n)) for n in GROUP_SIZES]
    return Expected(half_width_at=errors, dominated_below=below)


def _zero_below(m: Measurement, half: float, node: exp.Expression) -> int | None:
    """The group size under which a count, or a sum of values whose bounds do not reach
    0, can be at most its noise's half-width (a sum at its values' smallest
    magnitude); None for other sums (near 0 at any size) or a bare aggregate
    under arithmetic."""
    if not isinstance(node, exp.Column):
        return None
    if m.clamp is None:
        return _rows_below(half)
    lo, hi = m.bounds.lo, m.bounds.hi
    if lo <= 0 <= hi:
        return None
    return _rows_below(half / min(abs(lo), abs(hi)))


EVERY_SIZE = 2**53
"""The size reported for noise that dominates at every size: a ratio that overflows
(a sum of values as small as ``4.9e-324``: its half-width over them is infinite),
and the largest integer a JavaScript client reads exactly."""


def _rows_below(rows: float) -> int:
    """The smallest group size above ``rows``, at most ``EVERY_SIZE``."""
    return EVERY_SIZE if not rows < EVERY_SIZE else math.floor(rows) + 1


def _key_source(domain: KeyDomain) -> str:
    if domain.private:
        return "DP partition selection"
    return "integer range" if domain.span else "declared values"


def _key_selection_step(
    the_plan: Plan, keys: list[PlanKey], bounds: Contribution
) -> list[PlanStep]:
    """The noisy threshold that chooses private keys: its scale, threshold and (ε, δ)."""
    ks = the_plan.key_selection
    if ks is None:
        return []
    return [
        PlanStep(
            aggregate="GROUP BY " + ", ".join(k.label for k in the_plan.keys),
            kind="partition_selection",
            sensitivity=ks.l0 * ks.linf,
            norm=f"L0 ≤ {ks.l0}, L∞ ≤ {ks.linf}",
            mechanism=ks.mechanism,
            scale=ks.scale,
            threshold=ks.threshold,
            epsilon=ks.epsilon,
            cost=ProtocolCost(epsilon=ks.epsilon, delta=ks.delta),
            keys=keys,
            contribution=bounds,
        )
    ]


def stated_cost(cost: Cost) -> ProtocolCost:
    """A cost as the plan and the bounding report state it: ρ only where it says one
    (under zCDP; an approximate charge's ρ is infinite)."""
    rho = cost.rho if cost.rho and math.isfinite(cost.rho) else None
    return ProtocolCost(epsilon=cost.epsilon, delta=cost.delta, rho=rho)
