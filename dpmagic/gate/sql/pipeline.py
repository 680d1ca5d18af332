"""The gate's passes, in order: the one place that says what happens to a query.

Analysis, a function of the query text, its parameters, the asked budget and the
policy, never of the data. Every refusal happens here, before anything is charged:

    ============  ==========================  ==========  =====================
    pass          from                        to          module
    ============  ==========================  ==========  =====================
    parse         SQL text, parameters        Parsed      ``sql/parse.py``
    resolve       Parsed, Dataset             Resolved    ``sql/resolve.py``
    check         Resolved                    Checked     ``sql/check.py``
    bound         Checked                     Bounded     ``sql/bound.py``
    plan          Bounded, asked budget       Plan        ``sql/plan.py``
    rewrite       Plan, seed                  Rewritten   ``sql/rewrite.py``
    vet           Rewritten                   Rewritten   ``engines/duckdb/database.py``
    ============  ==========================  ==========  =====================

Execution, after the engine has debited the plan's cost:

    ============  ==========================  ===========  ====================
    run           Rewritten                   ExactResult  ``engines/duckdb/database.py``
    noise         Plan, Rewritten, exact      Noisy        ``sql/noise.py``
    release       Noisy                       Released     ``sql/release.py``
    report        Plan, exact left-out count  dict         ``sql/bounding_report.py``
    ============  ==========================  ===========  ====================

A plan with a bounding report (``dp/left_out.LeftOut``) also has a second query,
``rewrite.left_out``, vetted with the first and run after it.

Each pass decides what it decides once and hands it on as a typed value; a later
pass reads what it needs from the value it is given. The engine
(``dpmagic/gate/engine.py``) runs ``analyse`` and ``execute`` and does the
service work around them: the cache of analyses, the ledger, replay, the reply.

The analysis is bounded (``sql/limits.py``): ``resolve`` refuses a query whose
inlined form passes ``MAX_EXPANDED_NODES`` while it builds it, ``generate`` refuses
generated SQL over ``MAX_GENERATED_CHARS`` before DuckDB reads it, and the passes
run under a deadline of ``ANALYSIS_SECONDS``, checked before each pass and inside
``resolve``'s expansion (the engine's deadline covers ``analyse`` and ``generate``
together; called alone, each sets its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmagic.gate.dp.accounting import Accountant
from dpmagic.gate.dp.calibration import Accuracy
from dpmagic.gate.dp.levels import REPORT_ALPHA
from dpmagic.gate.engines.interface import Store
from dpmagic.gate.policy import Dataset
from dpmagic.gate.sql import bounding_report
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.clip import ClipBounds, ClipStage, bounds_checked, clip_bounded
from dpmagic.gate.sql.limits import check_deadline, check_generated, deadline
from dpmagic.gate.sql.noise import columnar, declared_keys, key_threshold, noise
from dpmagic.gate.sql.parse import Param, parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.post_query import PostQuery, post_query
from dpmagic.gate.sql.release import Released, release
from dpmagic.gate.sql.resolve import resolve
from dpmagic.gate.sql.rewrite import Rewritten, left_out, rewrite
from dpmagic.protocol import LeftOut


@dataclass(frozen=True)
class Asked:
    """What a query asks of the analysis, the policy's defaults filled in."""

    sql: str
    params: dict[str, Param]
    epsilon: float
    delta: float
    accuracy: Accuracy | None = None
    report: float | None = None  # the bounding report's share of the budget
    # A clipped query's stage (``clip.py``): its bounds' release, or the query clipped.
    clip: ClipStage | None = None


@dataclass(frozen=True)
class Analysed:
    """The analysis's result: the plan, and the SQL that computes it, vetted (and the
    bounding report's, when the plan has one)."""

    plan: Plan
    rewritten: Rewritten
    post: PostQuery
    report: Rewritten | None = None


@dataclass(frozen=True)
class Answer:
    """What ``execute`` hands the engine: the released table, and the bounding report
    when one was asked for (``bounding_report.report``)."""

    released: Released
    left_out: LeftOut | None


def analyse(asked: Asked, dataset: Dataset, accountant: Accountant) -> Plan:
    """parse → resolve → check → bound → plan: every check that can refuse the query
    from its text and the policy. Touches no data, costs nothing; refused when over
    the analysis's bounds (``sql/limits.py``)."""
    with deadline():
        parsed = parse(asked.sql, asked.params)
        check_deadline()
        resolved = resolve(parsed, dataset)
        check_deadline()
        checked = check(resolved)
        if isinstance(asked.clip, ClipBounds):
            checked = bounds_checked(checked)
        check_deadline()
        bounded = clip_bounded(bound(checked), asked.clip)
        check_deadline()
        the_plan = plan(
            bounded, asked.epsilon, asked.delta, accountant, asked.accuracy, asked.report,
            quantile_intervals=not isinstance(asked.clip, ClipBounds),
        )  # fmt: skip
        check_deadline()
        return the_plan


def generate(the_plan: Plan, seed: int, database: Store) -> Analysed:
    """rewrite → vet: the plan's SQL, refused if it would fail on empty tables (a
    failure that depends on no data, found before the debit), or if it is longer than
    ``MAX_GENERATED_CHARS`` (before DuckDB parses it)."""
    with deadline():
        check_deadline()
        rewritten = rewrite(the_plan, seed, database.dialect)
        check_generated(rewritten.sql)
        check_deadline()
        database.vet(rewritten.sql)
        report = None
        if the_plan.left_out is not None:
            check_deadline()
            report = left_out(the_plan, seed, database.dialect)
            check_generated(report.sql)
            check_deadline()
            database.vet(report.sql)
        post = post_query(the_plan)
    return Analysed(plan=the_plan, rewritten=rewritten, post=post, report=report)


def execute(analysed: Analysed, database: Store) -> Answer:
    """run → noise → release: the exact aggregates (never leaving the gate), the
    noise, and what the reply may carry; then the bounding report's count, noised
    likewise. Called only after the debit."""
    the_plan, rewritten = analysed.plan, analysed.rewritten
    batches = columnar(the_plan, rewritten) if getattr(database, "columnar", False) else None
    keep = None if the_plan.key_selection is None else key_threshold(the_plan, rewritten)
    if keep is None and the_plan.keys and the_plan.listed_at_fetch:
        keep = declared_keys(the_plan, rewritten)
    if batches is not None:  # in columns, undeclared keys dropped as each batch arrives
        exact = database.run(rewritten.sql, batches=batches)
    else:
        exact = database.run(rewritten.sql, keep)
    alpha = REPORT_ALPHA if the_plan.accuracy is None else the_plan.accuracy.alpha
    released = release(noise(the_plan, rewritten, exact), alpha, analysed.post)
    if analysed.report is None:
        return Answer(released, None)
    (counts,) = database.run(analysed.report.sql).rows
    return Answer(released, bounding_report.report(the_plan, counts, alpha))
