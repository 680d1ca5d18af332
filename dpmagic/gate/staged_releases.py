"""A query with subqueries used as values: its releases, in order, and what its reply
says about them (``sql/staged.py`` has the rule and the privacy argument).

1. every stage and the last query are analysed before anything runs (the last with
   a stand-in value where each released one will go): a refusal of any of them, and
   each one's cost, are decided from the text and the policy alone, before a debit;
2. each subquery is released, a query of its own in the ledger with its share of the
   query's (ε, δ), replayed alike on a re-run;
3. the query is released with the same share, each subquery replaced by its value.

The shares are equal: ``1 / (stages + 1)`` of the ε and the δ asked, each release
charged its own, the reply's ``cost`` their sum (sequential composition). The reply's
``stages`` says, as typed data, what each stage released: its SQL, its (ε, δ), its
value and that value's interval, and whether it was replayed. The client renders it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace as replace_struct

from dpmagic.gate.failures import Refused, required
from dpmagic.gate.policy import Dataset
from dpmagic.gate.public_reads import released_read
from dpmagic.gate.request import asked_budget, tightened
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.released_tables import Tabled
from dpmagic.gate.sql.released_tables import tabled as split_tabled
from dpmagic.gate.sql.staged import MAX_KEYS, Released, Staged, split
from dpmagic.protocol import PostProcessed, Stage

if TYPE_CHECKING:
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.padding import PrivateRead
    from dpmagic.gate.reply import Reply
    from dpmagic.gate.request import QueryRequest


def staged(request: QueryRequest, dataset: Dataset) -> Staged | None:
    """The request's stages, or None where it uses no subquery as a value. Parsed only
    when the text holds a second ``SELECT``: every other query is left to its one
    analysis, unparsed here."""
    if request.sql.lower().count("select") < 2:
        return None
    return split(parse(request.sql, request.params).tree, dataset)  # type: ignore[arg-type]


def answer(
    engine: Engine, user: str, request: QueryRequest, stages: Staged, reads: PrivateRead
) -> Reply:
    """The reply of a query with stages (``Engine.respond``): the last release's, with
    ``stages`` and ``cost`` the sum of all. A dry run shows the last stage's plan over
    the stand-in values and the cost of all."""
    _asked_by_epsilon(request)
    dataset = tightened(engine._dataset(request.dataset), request)
    eps, delta = asked_budget(dataset, request)
    share = shares(len(stages.stages))
    part = replace(request, params={}, epsilon=eps * share, delta=delta * share)
    asks = [replace(part, sql=sql) for sql in stages.stages]
    last = replace(part, sql=stages.filled(stages.stand_ins()))
    keyed = stages.keys or tuple(() for _ in asks)
    for ask, by in zip(asks, keyed, strict=True):
        plan = engine.analysis(user, dataset, ask).plan
        if not by and (plan.keys or len(plan.checked.outputs) != 1):
            raise Refused(
                "a subquery used as a value must release one value: one aggregate, without GROUP BY"
            )
    engine.analysis(user, dataset, last)  # refuses, free, what the last would refuse
    if request.dry_run:
        reply = engine._query(user, last, reads)
        return _told(reply, request, [None] * len(asks), asks, eps, delta)
    # The whole query's charge is checked before its first debit: the last with the
    # values its stages released before, where every one of them is replayed.
    stored = [engine.stored(user, dataset, ask) for ask in asks]
    known = all(r is not None for r in stored)
    then = replace(last, sql=stages.filled(_values(stored, keyed))) if known else last
    engine.fits_all(user, dataset, [*asks, then])
    releases = [engine._query(user, ask, reads) for ask in asks]
    reply = engine._query(user, replace(last, sql=stages.filled(_values(releases, keyed))), reads)
    return _told(reply, request, releases, asks, eps, delta)


def _values(releases: list[Reply] | list[Reply | None], keyed: tuple) -> list[Released]:
    """What each stage released, as the last stage reads it: one value, or the rows
    of a correlated subquery's keys and values (refused past ``MAX_KEYS``)."""
    values: list[Released] = []
    for release, by in zip(releases, keyed, strict=True):
        assert release is not None
        if not by:
            values.append(_value(release))
            continue
        rows = release.json()["rows"]
        if len(rows) > MAX_KEYS:
            raise Refused(
                f"the correlated subquery released {len(rows):,} keys; the query reads at "
                f"most {MAX_KEYS:,}: narrow it with a condition on its keys"
            )
        values.append(rows)
    return values


def _asked_by_epsilon(request: QueryRequest) -> None:
    """Refuse what a query with releases inside it is not asked with."""
    if request.accuracy is not None:
        raise Refused(
            "a query with subqueries used as values is asked with an ε, not an accuracy: "
            "each subquery is released first with its share"
        )
    if request.clip is not None or request.bounding_report is not None:
        raise Refused(
            "--clip and the bounding report are not offered with subqueries used as values"
        )


def tabled(engine: Engine, user: str, request: QueryRequest) -> Tabled | None:
    """The request split into releases the rest only post-processes
    (``sql/released_tables.py``), or None: where it has no second ``SELECT``, where
    the rest reads private rows, and where the query is answered as it stands (a
    per-person CTE read by an aggregate is one query, not a release of persons)."""
    if request.sql.lower().count("select") < 2:
        return None
    dataset = engine._dataset(request.dataset)
    found = split_tabled(parse(request.sql, request.params).tree, dataset)  # type: ignore[arg-type]
    if found is None:
        return None
    try:
        engine.analysis(user, dataset, request)
    except Refused:
        return found
    return None


def answer_tabled(
    engine: Engine, user: str, request: QueryRequest, tables: Tabled, reads: PrivateRead
) -> Reply:
    """The reply of a query whose private reads are all released first: each release
    with its share of the query's (ε, δ), then the rest read plainly over the released
    rows and the public tables. Every release's analysis and the rest's vetting come
    before the first debit; a dry run runs none of them."""
    _asked_by_epsilon(request)
    dataset = tightened(engine._dataset(request.dataset), request)
    eps, delta = asked_budget(dataset, request)
    share = 1 / len(tables.releases)
    part = replace(request, params={}, epsilon=eps * share, delta=delta * share)
    asks = [replace(part, sql=r.sql) for r in tables.releases]
    for ask, release in zip(asks, tables.releases, strict=True):
        plan = engine.analysis(user, dataset, ask).plan
        if release.name is None and (plan.keys or len(plan.checked.outputs) != 1):
            raise Refused(
                "a subquery used as a value must release one value: one aggregate, without GROUP BY"
            )
    released_read(tables.filled([None] * len(asks)), dataset, tables.public)
    if not request.dry_run:
        engine.fits_all(user, dataset, asks)
    outcomes = [engine._query(user, ask, reads) for ask in asks]
    rows = [None if request.dry_run else o.json()["rows"] for o in outcomes]
    read = released_read(tables.filled(rows), dataset, tables.public)
    reply = engine._plain(user, dataset, request, read)
    envelope = reply.envelope
    exact = required(envelope.exact, "a plain read's facts")
    envelope.exact = None
    envelope.post_processed = PostProcessed(
        public_tables=list(tables.public), row_limit=exact.row_limit, truncated=exact.truncated
    )
    envelope.stages = [
        _stage_fact(ask, release, outcome, request.dry_run)
        for ask, release, outcome in zip(asks, tables.releases, outcomes, strict=True)
    ]
    envelope.cost = sum((o.envelope.cost for o in outcomes[1:]), outcomes[0].envelope.cost)
    envelope.request = replace_struct(
        required(envelope.request, "what was asked"), epsilon=eps, delta=delta
    )
    return reply


def _stage_fact(ask: QueryRequest, release: Any, outcome: Reply, dry_run: bool) -> Stage:
    """What one release of a query said, as typed data: its SQL and (ε, δ); after the
    run, its one value and interval, or how many rows it released; and whether it was
    a replay."""
    entry = _stage(ask)
    if dry_run:
        return entry
    entry.replayed = outcome.envelope.replayed
    if release.name is None:
        entry.value, entry.interval = _value(outcome), _interval(outcome.json())
    else:
        entry.rows, entry.table = len(outcome.json()["rows"]), release.name
    return entry


def _stage(ask: QueryRequest) -> Stage:
    """A stage's SQL and its share of the query's (ε, δ)."""
    epsilon = required(ask.epsilon, "a stage's ε")
    return Stage(sql=ask.sql, epsilon=epsilon, delta=required(ask.delta, "a stage's δ"))


def shares(stages: int) -> float:
    """Each release's share of the query's (ε, δ): equal, so that together they spend
    what was asked (sequential composition)."""
    return 1 / (stages + 1)


def _value(release: Reply) -> float | None:
    """The one value a stage released (its one cell), as a number or NULL."""
    rows = release.json()["rows"]
    cell = rows[0][0] if rows and rows[0] else None
    return None if cell is None else float(cell)


def _interval(release: dict[str, Any]) -> list[float] | None:
    columns = (release.get("accuracy") or {}).get("columns") or []
    column = (columns[0] if columns else None) or {}
    (pair,) = column.get("intervals") or [None]
    return None if pair is None else [float(pair[0]), float(pair[1])]


def _told(
    reply: Reply,
    request: QueryRequest,
    releases: list[Reply] | list[None],
    asks: list[QueryRequest],
    eps: float,
    delta: float,
) -> Reply:
    """``reply`` saying what its stages released, what was asked (the user's text and
    whole budget), and what all its releases cost together."""
    envelope = reply.envelope
    stages: list[Stage] = []
    cost = envelope.cost
    for ask, release in zip(asks, releases, strict=True):
        entry = _stage(ask)
        if release is not None:
            shown = release.json()
            entry.replayed = release.envelope.replayed
            if len(shown["columns"]) > 1:  # a correlated subquery's: a value a key
                entry.rows = len(shown["rows"])
            else:
                entry.value, entry.interval = _value(release), _interval(shown)
            cost += release.envelope.cost
        else:  # a dry run: what each stage would cost
            cost += envelope.cost
        stages.append(entry)
    envelope.stages = stages
    envelope.cost = cost
    envelope.request = replace_struct(
        required(envelope.request, "what was asked"),
        sql=request.sql,
        params=request.params,
        epsilon=eps,
        delta=delta,
    )
    return reply
