"""A clipped query's releases, in order, and what its reply says about them
(``sql/clip.py`` has the rule and the privacy argument).

1. the bounds and a count of each summed argument's values, and where the dataset
   has a unit the rows each person brings and a count of persons, with ``SHARE`` of ε;
2. the rule (``clip.clipped``), from that release and its plan: per argument the
   bounds from the data or the declared ones, and the rows per person chosen or the
   policy's (the stage carries it, and ``request.tightened`` applies it from here on);
3. where some argument is clipped at bounds from the data, a noisy count per group
   of the values the clip moves (``ClipMoved``), with ``MOVED_SHARE`` of the ε left;
4. the query, with the rest, each argument cut to its bounds.

Each release is a query of its own in the ledger and replays alike (a re-run replays
all of them, and the rule, a function of the replayed first release, decides the
same). The reply's ``clip`` is built here (``facts``) from the stage and the
releases, as typed data: which bounds were used and why, the figures the rule read,
what the cells' intervals hold, and the values moved. The client renders it.

``answer`` is meant as the engine's ``Engine._clipped`` (a one-line delegate there,
and ``Engine._envelope`` building the query release's ``clip`` with ``facts``, so
that the ledger and transcripts keep it): it reads the engine's analysis, its
one-query path (``Engine.analysis``, ``Engine._query``, ``Engine._dataset``), and
``request.py``'s ``tightened`` and ``asked_budget``. Until the engine delegates, the
engine's own two releases run (``clipped`` given the row alone: the bounds as
released, no rule), and tests and the benchmark install ``answer`` themselves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dpmagic.gate.failures import Failed, required
from dpmagic.gate.policy import AccountantKind
from dpmagic.gate.request import asked_budget, tightened
from dpmagic.gate.sql.clip import (
    DATA,
    LEVELS,
    MOVED_SHARE,
    PREFIX,
    ROWS_FACTOR,
    ROWS_LEVEL,
    USEFUL_RANKS,
    ClipBounds,
    ClipMoved,
    Clipped,
    MovedCount,
    clipped,
    targets,
)
from dpmagic.protocol import Clip, ClipChoice, ClipRows, Moved

if TYPE_CHECKING:
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.padding import PrivateRead
    from dpmagic.gate.reply import Reply
    from dpmagic.gate.request import QueryRequest


RULE = (
    f"bounds are chosen at the {LEVELS[0]:.0%} and {LEVELS[1]:.0%} quantiles of all the "
    f"query's rows together, and the rows each person brings at {ROWS_FACTOR} times the "
    f"{ROWS_LEVEL:.0%} quantile of the persons' counts of rows; each is used when its 95% "
    "rank error (from the ε spent and the candidate count) is at most "
    f"{USEFUL_RANKS:.0%} of the values (persons) counted (the lower end of the count's "
    "95% interval); otherwise the declared bounds are kept"
)


def answer(engine: Engine, user: str, request: QueryRequest, reads: PrivateRead) -> Reply:
    """A clipped query's reply (``Engine._clipped``): its releases in order, the reply
    of the last with ``clip`` saying what the others decided and ``cost`` their sum. A
    dry run shows the query's plan before any bound is chosen, and what the releases
    together would cost."""
    share = required(request.clip, "the clip's share")
    dataset = tightened(engine._dataset(request.dataset), request)
    eps, delta = asked_budget(dataset, request)
    rest = replace(request, epsilon=eps * (1 - share), whole_epsilon=eps)
    main = engine.analysis(user, dataset, rest).plan
    # The bounds and the values moved are pure ε-DP (a quantile selection, counts
    # without partition selection): under the approx accountant they spend no δ, so
    # the releases together cost the (ε, δ) asked for. Under zCDP every query needs
    # its δ to state a cost, and each states its own.
    side = delta if dataset.accountant == AccountantKind.ZCDP else 0.0
    asked = replace(rest, epsilon=eps * share, delta=side, stage=ClipBounds())
    if request.dry_run:  # the query's plan, and the cost of both releases, nothing charged
        reply = engine._query(user, rest, reads)
        reply.envelope.cost += engine._query(user, asked, reads).envelope.cost
        reply.envelope.clip = Clip(share=share, epsilon=eps * share, rule=RULE, chosen=[])
        return reply
    first = engine._query(user, asked, reads)
    first_plan = engine.analysis(user, dataset, asked).plan
    released = first.json()
    rows = released["rows"]
    if not rows or any(v is None for v in rows[0]):
        raise Failed("the clip's bounds could not be chosen; nothing more was charged")
    counted = _count_intervals(released, len(targets(main.checked)))
    stage = clipped(main.checked, [float(v) for v in rows[0]], first_plan, counted)
    releases = [first]
    left = eps * (1 - share)
    if stage.moves:
        counting = replace(rest, epsilon=left * MOVED_SHARE, delta=side, stage=ClipMoved(stage))
        moved = engine._query(user, counting, reads)
        releases.append(moved)
        labels = [f.aggregate for f in stage.facts if f.source == DATA]
        stage = replace(stage, moved=moved_counts(moved.json(), labels))
        left *= 1 - MOVED_SHARE
    reply = engine._query(user, replace(rest, epsilon=left, stage=stage), reads)
    envelope = reply.envelope
    envelope.clip = facts(stage, share, eps)
    envelope.clip.replayed = all(r.envelope.replayed for r in [*releases, reply])
    envelope.cost = sum((r.envelope.cost for r in releases), envelope.cost)
    return reply


def _count_intervals(released: dict[str, Any], summed: int) -> list[tuple[float, float] | None]:
    """The 95% interval of each count in the first release, as its reply carries it:
    each summed argument's (every third column, after its two bounds), then, where
    rows per person were chosen, the persons' (the last column, after the rows)."""
    columns = (released.get("accuracy") or {}).get("columns") or []
    at = [*range(2, 3 * summed, 3), *([len(columns) - 1] if len(columns) > 3 * summed else [])]
    out: list[tuple[float, float] | None] = []
    for j in at:
        column = columns[j] or {}
        (pair,) = column.get("intervals") or [None]
        out.append(None if pair is None else (float(pair[0]), float(pair[1])))
    return out


def facts(stage: Clipped, share: float, epsilon: float) -> Clip:
    """The reply's ``clip`` for the query's release (a function of its stage, the
    share and the whole ε alone, so that ``Engine._envelope`` can build it where it
    builds the rest): ``protocol.Clip``, the moved counts' ε 0 when nothing was
    clipped; per summed argument a ``ClipChoice`` saying which bounds and why, and
    where the clip was used the values moved, per group."""
    chosen: list[ClipChoice] = []
    for fact in stage.facts:
        used = fact.source == DATA
        lo, hi = fact.bounds
        moved = [
            Moved(group=list(m.group), count=m.count,
                  interval=None if m.interval is None else list(m.interval))
            for m in stage.moved
            if m.aggregate == fact.aggregate
        ]  # fmt: skip
        chosen.append(
            ClipChoice(
                aggregate=fact.aggregate,
                bounds=[lo, hi],
                source=fact.source,
                reason=fact.reason,
                selected=list(fact.selected),
                declared=list(fact.declared),
                rank_error=fact.rank_error,
                values=fact.values,
                values_low=fact.values_low,
                holds=(
                    f"{fact.aggregate} of the values moved into [{lo:g}, {hi:g}], "
                    "not of the values as stored"
                    if used
                    else f"{fact.aggregate} over the declared bounds (nothing moved)"
                ),
                moved=moved if used else None,
            )
        )
    if not stage.facts:  # a stage made without the rule: the bounds as released
        chosen = [ClipChoice(aggregate=key, bounds=[lo, hi]) for key, lo, hi in stage.clips]
    rows = stage.rows
    return Clip(
        share=share,
        epsilon=epsilon * share,
        moved_epsilon=epsilon * (1 - share) * MOVED_SHARE if stage.moves else 0.0,
        rule=RULE,
        chosen=chosen,
        rows=None
        if rows is None
        else ClipRows(
            rows=rows.rows,
            source=rows.source,
            reason=rows.reason,
            selected=rows.selected,
            declared=rows.declared,
            level=ROWS_LEVEL,
            rank_error=rows.rank_error,
            persons=rows.persons,
            persons_low=rows.persons_low,
        ),
    )


def moved_counts(moved: dict[str, Any], labels: list[str]) -> tuple[MovedCount, ...]:
    """The third release's cells (``labels``: the arguments clipped at bounds from the
    data, in the order ``moved_checked`` counts them, after the group keys): per group
    and argument the noisy count of values moved and its 95% interval."""
    columns = moved["columns"]
    keys = [i for i, c in enumerate(columns) if c.startswith(f"{PREFIX}k")]
    counts = [j for j in range(len(columns)) if j not in keys]
    accuracy = (moved.get("accuracy") or {}).get("columns") or [None] * len(columns)
    out = []
    for label, j in zip(labels, counts, strict=True):
        cells = (accuracy[j] or {}).get("intervals") or [None] * len(moved["rows"])
        for row, pair in zip(moved["rows"], cells, strict=True):
            interval = None if pair is None else (float(pair[0]), float(pair[1]))
            out.append(MovedCount(label, tuple(row[k] for k in keys), row[j], interval))
    return tuple(out)
