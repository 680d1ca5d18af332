"""The gate's request handling: the passes of ``sql/pipeline.py``, and around them
the service work: the cache of analyses, the ledger, replay and the reply.

Order matters for privacy. Everything that can refuse a query (parsing,
names, the allow-list, bounds, the plan, the budget) happens before the data
is touched and costs nothing. The debit is committed before the query runs,
so neither an error nor a timeout after it can be used to learn something
for free; such failures are answered with a fixed message. Its flush to the
disk runs beside the query, and recording the release or the failure waits
for it, so nothing about the query leaves before the charge would survive a
power cut (``ledger/store.py``).

A release is served to another user only where it counts against every budget
they are under, and what it does not count against yet is charged as it is
served, as durably as a debit (``Ledger.serve_shared``); the same question asked
while its first release runs waits for it rather than making another
(``_Flights``), so everyone who asks is served the same numbers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import partial
from typing import cast

from msgspec.structs import replace as replace_struct

from dpmagic import protocol
from dpmagic.gate import clip_releases, replay_hints, staged_releases
from dpmagic.gate.admission import Admission
from dpmagic.gate.analysis_cache import BYTES_PER_CHAR, AnalysisCache
from dpmagic.gate.dp.accounting import Accountant, AccountantError, Cost, make_accountant
from dpmagic.gate.dp.calibration import Accuracy
from dpmagic.gate.dp.levels import REPORT_ALPHA
from dpmagic.gate.dp.mechanisms import calibrate
from dpmagic.gate.engines.interface import OutOfResources, PublicRead
from dpmagic.gate.engines.registry import open_store
from dpmagic.gate.engines.run_locks import FlightLocks, RunLocks
from dpmagic.gate.failures import (
    BadRequest,
    Failed,
    GateError,
    OverBudget,
    PublicOnly,
    Refused,
    required,
)
from dpmagic.gate.ledger.replays import ReplayKey
from dpmagic.gate.ledger.scopes import applicable
from dpmagic.gate.ledger.store import Charge, Ledger
from dpmagic.gate.ledger.views import budget_views, history_entries
from dpmagic.gate.membership import Membership
from dpmagic.gate.padding import PrivateRead
from dpmagic.gate.policy import Dataset, Policy, PolicyError
from dpmagic.gate.policy.values import Sharing
from dpmagic.gate.preview import PreviewRequest, utility_preview
from dpmagic.gate.public_reads import public_read
from dpmagic.gate.replay_hints import ReplayHints, Scope
from dpmagic.gate.reply import Reply
from dpmagic.gate.request import QueryRequest, asked_budget, tightened
from dpmagic.gate.sql import bounding_report
from dpmagic.gate.sql.clip import ClipBounds, ClipMoved, Clipped
from dpmagic.gate.sql.limits import deadline
from dpmagic.gate.sql.parse import Param
from dpmagic.gate.sql.pipeline import Analysed, Answer, Asked, analyse, execute, generate
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.rewrite import Rewritten
from dpmagic.gate.sql.summary import summary
from dpmagic.protocol import QueryReply

log = logging.getLogger("dpmagic.gate")

# Part of every replay key: a change to how answers are computed must not
# replay answers computed the old way.
ANSWER_VERSION = "2"
# A user's failures after the debit are counted over this window (``_within_failures``).
FAILURE_WINDOW_S = 24 * 3600


@dataclass(frozen=True)
class Analysis:
    """What a query's text, parameters and asked budget determine, before any data:
    the analysis passes' result (``pipeline``) and the replay key."""

    analysed: Analysed
    replay_key: ReplayKey
    bounds: protocol.Bounding  # ``bounding_report.statement``: the bounds every answer is over

    @property
    def plan(self) -> Plan:
        return self.analysed.plan

    @property
    def rewritten(self) -> Rewritten:
        return self.analysed.rewritten


@dataclass(eq=False)
class _Flight:
    """One request releasing a replay key afresh, and whom it could be served to: its
    user, and under group sharing whoever shares one of ``groups`` with it."""

    user: str
    groups: frozenset[str]
    landed: threading.Event = field(default_factory=threading.Event)

    def serves(self, user: str, groups: frozenset[str], sharing: Sharing) -> bool:
        """Whether what this flight releases could be served to ``user``: their own,
        anyone's under ``everyone``, under ``group`` a release charged to a group
        they are in (``Ledger.serve_shared`` decides, once it is recorded)."""
        if user == self.user or sharing == Sharing.EVERYONE:
            return True
        return sharing == Sharing.GROUP and bool(groups & self.groups)


class _Flights:
    """Single flight: the same question asked while its first release runs waits for
    that release instead of making another.

    Without it, concurrent identical asks each found no release in the ledger and
    each were debited and run: 32 asks of one text by 4 users under ``everyone``
    made 7 to 14 releases, each charged, each with its own noise, where every
    asker is to be served the same numbers. A request that finds no release it
    could be served boards a flight of its replay key on its dataset: it leads one
    (and releases) unless one is already in the air whose release it could be served
    (``_Flight.serves``); then it waits for that flight to land and asks the ledger
    again. A flight lands, in a ``finally``, only after its release is recorded or
    it failed or was refused, so a waiter finds the release or, finding none, asks
    as if it had never been: it boards again, and one waiter leads the next.

    A leader boards before reading the ledger, so a release recorded by an earlier
    leader is found by it and one recorded later has this flight to wait on: there is
    no moment when a request neither finds a release nor sees its flight. Across the
    gate's worker processes (and gates sharing a state directory) a leader also holds
    a lock per scope its release is served in (``engines/run_locks.FlightLocks``), so
    a leader of the same question in another process, whose release this one could be
    served, is waited for the same way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flying: dict[tuple[str, str], list[_Flight]] = {}

    def board(
        self, dataset: str, key: str, user: str, groups: frozenset[str], sharing: Sharing
    ) -> tuple[_Flight, bool]:
        """The flight ``user`` waits for (and False), or a new one they lead (True)."""
        with self._lock:
            flying = self._flying.setdefault((dataset, key), [])
            for flight in flying:
                if flight.serves(user, groups, sharing):
                    return flight, False
            flight = _Flight(user, groups)
            flying.append(flight)
            return flight, True

    def land(self, dataset: str, key: str, flight: _Flight) -> None:
        """The leader's release is recorded, or it failed: wake whoever waits on it."""
        with self._lock:
            flying = self._flying[(dataset, key)]
            flying.remove(flight)
            if not flying:
                del self._flying[(dataset, key)]
        flight.landed.set()


class Engine:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        # The seed of the per-query contribution bounding after joins, one per dataset,
        # secret and drawn at each start like the load-time rank's (``rewrite``: the
        # bound holds for every fixed seed). Fixed, it makes the generated SQL a
        # function of the plan, so it can be cached and vetted once.
        self._seeds = {name: secrets.randbits(62) for name in policy.datasets}
        # Analyses kept for a user's repeated query texts (a notebook re-run, a
        # dashboard), per user and bounded in bytes (``analysis_cache.py``).
        self._analyses: AnalysisCache[Analysis] = AnalysisCache()
        # The replay keys of released texts, so a text asked again is replayed (or served
        # shared) without its analysis, where the ledger would serve it (``replay_hints``).
        self._hints = ReplayHints()
        self.accountants = {
            name: make_accountant(ds.accountant) for name, ds in policy.datasets.items()
        }
        # Data first: a policy whose files are missing fails before any state is written.
        self.databases = {name: open_store(ds, policy.gate) for name, ds in policy.datasets.items()}
        # Who runs on each dataset's engine, and when (``admission.py``); a user's one
        # run held across the gate's worker processes too (``engines/run_locks.py``).
        self._admissions = {
            name: Admission(locks=RunLocks(policy.gate.state_dir, name)) for name in policy.datasets
        }
        # A public table's contents are public: its columns' values become known keys, its
        # size and its values' repeats bound what a join with it costs (``sql/work.py``).
        datasets = {n: self.databases[n].public_facts(ds) for n, ds in policy.datasets.items()}
        self.policy = policy = replace(policy, datasets=datasets)
        self.ledger = Ledger(
            policy.gate.state_dir / "ledger.sqlite3", make_accountant(policy.gate.accountant)
        )
        # Users' groups: the policy's, and a Hub's as its authenticator reports them.
        self.membership = Membership(policy.groups)
        # The first releases running, so that the same question asked meanwhile waits
        # for one and is served it rather than released again (``_Flights``).
        self._flights = _Flights()
        # The same across the gate's worker processes (``engines/run_locks.py``).
        self._flight_locks = FlightLocks(policy.gate.state_dir)

    def close(self) -> None:
        for db in self.databases.values():
            db.close()
        self.ledger.close()

    def analyse(self, dataset: Dataset, request: QueryRequest) -> Plan:
        """Every check that can refuse a query (``pipeline.analyse``); touches no
        data, costs nothing."""
        return plan_request(dataset, self.accountants[dataset.name], request)

    def analysis(self, user: str, dataset: Dataset, request: QueryRequest) -> Analysis:
        """``analyse`` and ``rewrite``, remembered per user, query text, parameters and
        asked budget: all of it is a function of those and of the policy, which is fixed
        for the engine's life, and none of it of the data. Kept per user, so the time
        of a reply never says whether someone else sent the same text. A refusal is
        not remembered (it raises), so it is analysed again each time."""
        key = text_key(dataset, request)
        if key is None:  # not from a JSON body: not worth a key
            return self._analysed(dataset, request)
        found = self._analyses.get(user, key)
        if found is None:
            found = self._analysed(dataset, request)
            self._analyses.put(user, key, found, _estimated_bytes(found))
        return found

    def _analysed(self, dataset: Dataset, request: QueryRequest) -> Analysis:
        try:
            with deadline():  # one for analyse and generate together (``sql/limits.py``)
                return self._analysed_once(dataset, request)
        except GateError:
            raise
        except RecursionError:
            # A tree nested deeper than the passes recurse (thousands of parentheses):
            # a fact of the text alone, refused before the debit like any other.
            raise Refused("the query is nested too deeply to analyse") from None
        except Exception as exc:
            # The analysis reads the query and the policy, never private data: whatever
            # fails in it fails alike on every dataset, and nothing has been charged.
            log.error("analysis failed: %s", type(exc).__name__)
            raise Refused(f"the gate could not analyse this query ({type(exc).__name__})") from None

    def _analysed_once(self, dataset: Dataset, request: QueryRequest) -> Analysis:
        the_plan = self.analyse(dataset, request)
        # Whatever could make the SQL fail without depending on the data is refused here,
        # before the debit: after it, only time and memory can run out.
        analysed = generate(the_plan, self._seeds[dataset.name], self.databases[dataset.name])
        return Analysis(
            analysed,
            replay_key=self._replay_key(dataset, the_plan, request),
            bounds=bounding_report.statement(the_plan),
        )

    def query(self, user: str, body: object, reads: PrivateRead | None = None) -> dict[str, object]:
        """Answer a query body, as the JSON reply carries it (``respond``'s reply with its
        cells as lists)."""
        return self.respond(user, body, reads).json()

    def respond(self, user: str, body: object, reads: PrivateRead | None = None) -> Reply:
        """Answer a query body: the reply with its cells in columns (``reply.py``).
        ``reads`` is marked where a run on the private data begins, so the server pads
        the reply of exactly those requests (``padding.py``); a replay, a dry
        run or a refusal before the run leaves it unmarked."""
        reads = PrivateRead() if reads is None else reads
        request = QueryRequest.from_body(body)
        try:
            if self._public_first(request):  # before stages: its subqueries are public too
                return self._read_public(user, request, PublicOnly("public tables only"))
            tables = staged_releases.tabled(self, user, request)
            if tables is not None:
                return staged_releases.answer_tabled(self, user, request, tables, reads)
            stages = staged_releases.staged(request, self._dataset(request.dataset))
            if stages is not None:
                return staged_releases.answer(self, user, request, stages, reads)
            if request.clip is not None:
                return self._clipped(user, request, reads)
            return self._query(user, request, reads)
        except PublicOnly as exc:
            try:
                return self._read_public(user, request, exc)
            except Refused as refused:
                self._record_refusal(user, request, refused)
                raise
        except (Refused, OverBudget) as exc:
            self._record_refusal(user, request, exc)
            raise

    def _public_first(self, request: QueryRequest) -> bool:
        """Whether a query with subqueries reads public tables only on a dataset that
        serves them plainly: it is then read plainly, its subqueries with it, rather than
        released in stages. Parsed only where the dataset allows plain reads and the text
        holds a second SELECT (every other query meets the resolver's ``PublicOnly``)."""
        if request.sql.lower().count("select") < 2:
            return False
        dataset = self._dataset(request.dataset)
        if not dataset.public_tables_readable:
            return False
        return public_read(request.sql, request.params, dataset) is not None

    def _read_public(self, user: str, request: QueryRequest, refusal: PublicOnly) -> Reply:
        """A query over public tables only, read plainly where the owner allows it
        (``public_reads.py``): exact, free, unpadded, kept in no ledger; else refused."""
        dataset = self._dataset(request.dataset)
        read = public_read(request.sql, request.params, dataset)
        if read is None:
            raise Refused(
                "the query reads only public tables, but names a private table where it is "
                "not read (an unused CTE) or uses what a plain read does not allow (a "
                "window, a table function): select, filter, join, group, order"
                if dataset.public_tables_readable
                else refusal.message
            )
        return self._plain(user, dataset, request, read)

    def _plain(self, user: str, dataset: Dataset, request: QueryRequest, read: PublicRead) -> Reply:
        """The reply of a vetted plain read (nothing run on a dry run): exact, free."""
        columns, rows = [], []
        truncated = False
        if not request.dry_run:
            store = self.databases[dataset.name]
            columns, rows, truncated = store.read_public(read)  # type: ignore[attr-defined]
        reply = QueryReply(
            dataset=dataset.name,
            engine=dataset.engine,
            columns=columns,
            # DuckDB's DECIMAL (a literal like 1.5) as the double JSON carries.
            rows=[[float(v) if isinstance(v, Decimal) else v for v in r] for r in rows],
            dry_run=request.dry_run,
            accuracy=protocol.Accuracy(alpha=REPORT_ALPHA, columns=[None] * len(columns)),
            # What the user reads: exact, because only public tables were read.
            exact=protocol.Exact(row_limit=read.limit, truncated=truncated),
            request=protocol.Asked(sql=request.sql, params=request.params),
            budget=self._budget_views(user, dataset, request.notebook),
        )
        return Reply.of(reply)

    def _record_refusal(self, user: str, request: QueryRequest, exc: GateError) -> None:
        """Keep a query refused before its debit in the ledger, with the reason its user
        is told (which names no private value: it is decided from the SQL, the policy
        and the ledger), for the owner's log; a dry run, which charges nothing when
        answered either, and a dataset the gate does not serve are not kept."""
        if request.dry_run:
            return
        try:
            name = self._dataset(request.dataset).name
        except BadRequest:
            return
        self.ledger.record_refusal(
            user=user, dataset=name, notebook=request.notebook, sql=request.label,
            reason=exc.message,
        )  # fmt: skip

    def _clipped(self, user: str, request: QueryRequest, reads: PrivateRead) -> Reply:
        """A query whose sums are clipped at value bounds it chooses privately: its
        releases (the bounds, the rule, the values moved, the query), each a query of
        its own in the ledger, and its reply are ``clip_releases.answer``'s."""
        return clip_releases.answer(self, user, request, reads)

    def _query(self, user: str, request: QueryRequest, reads: PrivateRead) -> Reply:
        """A query's reply: a dry run's plan, a replay from the ledger, or, after the
        debit, a fresh release (stored for later replays)."""
        dataset = tightened(self._dataset(request.dataset), request)
        if not request.dry_run and not request.fresh:
            hinted = self._hinted(user, dataset, request)
            if hinted is not None:
                return hinted
        analysis = self.analysis(user, dataset, request)
        reply = _envelope(dataset, analysis, request)
        if request.dry_run:
            reply.columns = [o.name for o in analysis.plan.checked.outputs]
            reply.accuracy = protocol.Accuracy(alpha=REPORT_ALPHA, columns=[])
            reply.budget = self._budget_views(user, dataset, request.notebook)
            return Reply.of(reply)
        if request.fresh:  # a new release, asked for: no replay, no flight to wait on
            return self._released(user, dataset, request, analysis, reply, reads, None)
        key = analysis.replay_key
        groups = self.membership.of(user)
        while True:
            flight, leading = self._flights.board(
                dataset.name, key, user, groups, dataset.share_releases
            )
            if not leading:
                # Served, if at all, once another request's run on the private data is
                # over: this reply's time follows that run's, so it is padded too.
                reads.begin()
                flight.landed.wait()
                stored = self._replayed(user, dataset, request, key, groups)
                if stored is not None:
                    self._remember(user, dataset, request, analysis, groups)
                    return stored
                continue  # that release failed or was refused: ask as if it never was
            try:
                # The flight across the gate's workers: a leader of the same question in
                # another worker, whose release could be served to this user, is waited
                # for (padded: the wait follows its run) before the ledger is read.
                scopes = _hint_scopes(user, dataset, groups)
                with self._flight_locks.holding(str(key), scopes, reads.begin):
                    # Read after boarding: a release recorded before is found here, and
                    # one recorded after waits for this flight to land.
                    stored = self._replayed(user, dataset, request, key, groups)
                    if stored is not None:
                        self._remember(user, dataset, request, analysis, groups)
                        return stored
                    # The same query released before over other data or policy facts:
                    # answered afresh (and charged: it is a new release), saying why.
                    fresh = self.ledger.fresh_because(user, dataset.name, key)
                    return self._released(user, dataset, request, analysis, reply, reads, fresh)
            finally:
                self._flights.land(dataset.name, key, flight)

    def _released(
        self,
        user: str,
        dataset: Dataset,
        request: QueryRequest,
        analysis: Analysis,
        reply: QueryReply,
        reads: PrivateRead,
        fresh_because: str | None,
    ) -> Reply:
        """A fresh release: the debit, the run, the reply stored for later replays."""
        charge, answer = self._charged_run(user, dataset, request, analysis, reads)
        released = answer.released
        reply = replace_struct(
            reply,
            columns=released.columns,
            rows=released.values,
            accuracy=replace_struct(released.cells_accuracy, bounds=analysis.bounds.text),
        )
        if answer.left_out is not None:  # a copy: the analysis's statement is kept for others
            reply.bounding = replace_struct(analysis.bounds, left_out=answer.left_out)
        # The cells are written once, for the ledger and for the reply (``Reply``).
        released_reply = Reply.of(reply)
        self.ledger.record_release(charge, released_reply)
        self._remember(user, dataset, request, analysis, self.membership.of(user))
        if fresh_because is not None:  # not stored: a replay of this answer is not fresh
            released_reply.envelope.fresh_because = fresh_because
        released_reply.envelope.budget = self._budget_views(user, dataset, request.notebook)
        return released_reply

    def _hinted(self, user: str, dataset: Dataset, request: QueryRequest) -> Reply | None:
        """The reply ``_replayed`` gives for a text released before, found by its hint
        without analysing it; None where there is no hint in the user's scopes or the
        ledger does not serve it (then the query is analysed as any other)."""
        text = text_key(dataset, request)
        if text is None:
            return None
        groups = self.membership.of(user)
        key = self._hints.find(_hint_scopes(user, dataset, groups), text)
        if key is None:
            return None
        return self._replayed(user, dataset, request, key, groups)

    def _remember(
        self,
        user: str,
        dataset: Dataset,
        request: QueryRequest,
        analysis: Analysis,
        groups: frozenset[str],
    ) -> None:
        """A hint for a text released or served to ``user``: in the user's own scope and
        in those the release now counts for (``replay_hints``)."""
        text = text_key(dataset, request)
        if text is not None:
            scopes = _hint_scopes(user, dataset, groups)
            self._hints.remember(scopes, text, analysis.replay_key)

    def _replayed(
        self,
        user: str,
        dataset: Dataset,
        request: QueryRequest,
        key: ReplayKey,
        groups: frozenset[str],
    ) -> Reply | None:
        """The stored reply of the same query over the same data and policy facts; None
        when there is none. The user's own is replayed at no cost. Where the dataset
        shares releases, one released to another user (to anyone, or one counting
        against a group the asker is in) is served, marked ``shared`` with when and at
        what cost it was released, and charged to every budget the asker is under that
        it did not count against yet (``Ledger.serve_shared``: the asker's own, and
        their groups' it was not charged to; docs/privacy.md, "Shared releases"),
        or refused, OverBudget, where one of those cannot pay."""
        stored = self.ledger.find_release(user, dataset.name, key)
        if stored is not None:
            self.ledger.record_replay(
                user=user,
                dataset=dataset.name,
                notebook=request.notebook,
                sql=request.label,
                replay_key=key,
            )
            stored.envelope.replayed, stored.envelope.cost = True, protocol.FREE
            stored.envelope.budget = self._budget_views(user, dataset, request.notebook)
            return stored
        if dataset.share_releases == Sharing.NONE:
            return None
        shared = self.ledger.serve_shared(
            user=user,
            dataset=dataset.name,
            notebook=request.notebook,
            replay_key=key,
            groups=groups,
            everyone=dataset.share_releases == Sharing.EVERYONE,
            limits=applicable(dataset, user, request.notebook, groups),
            sql=request.label,
            accountant=self.accountants[dataset.name],
        )
        if shared is None:
            return None
        stored = shared.reply
        envelope = stored.envelope
        envelope.shared = protocol.Shared(
            released_at=shared.time,
            cost=wire_cost(shared.cost),
            scope=dataset.share_releases.value,
            # The budgets serving it charged now (the user's, the groups' it had not
            # counted against), each as the API names a budget; none when it was free.
            charged_to=[scope.named() for scope in shared.charged_to],
        )
        # The asker's own words: another user's text (and its comments) stays theirs.
        asked = envelope.request or protocol.Asked()
        envelope.request = replace_struct(asked, sql=request.sql)
        envelope.replayed, envelope.cost = True, wire_cost(shared.charged)
        envelope.budget = self._budget_views(user, dataset, request.notebook)
        return stored

    def stored(self, user: str, dataset: Dataset, request: QueryRequest) -> Reply | None:
        """The reply this user was released for ``request`` before, which a new ask
        replays free; None where there is none."""
        key = self.analysis(user, dataset, request).replay_key
        return self.ledger.find_release(user, dataset.name, key)

    def fits_all(self, user: str, dataset: Dataset, requests: list[QueryRequest]) -> None:
        """Refuse, before any of them is charged, releases whose costs together do not
        fit the user's budgets now (``requests``: a query's stages and itself); one
        this user was released before is replayed, free, and counts nothing."""
        total = [0.0, 0.0, 0.0]
        for request in requests:
            if not request.fresh and self.stored(user, dataset, request) is not None:
                continue  # replayed, free (a fresh ask releases again, and pays)
            cost = self.analysis(user, dataset, request).plan.cost
            total = [total[0] + cost.epsilon, total[1] + cost.delta, total[2] + cost.rho]
        self.ledger.check(
            user=user,
            dataset=dataset.name,
            cost=Cost(*total),
            limits=applicable(dataset, user, requests[0].notebook, self.membership.of(user)),
            accountant=self.accountants[dataset.name],
        )

    def _charged_run(
        self,
        user: str,
        dataset: Dataset,
        request: QueryRequest,
        analysis: Analysis,
        reads: PrivateRead,
    ) -> tuple[Charge, Answer]:
        """The debit, durable first, then the run; a failure after the debit stays
        charged and is told in a fixed text (its own may quote data)."""
        self._within_failures(user, dataset)
        groups = self.membership.of(user)
        charge = self.ledger.debit(
            user=user,
            dataset=dataset.name,
            notebook=request.notebook,
            cost=analysis.plan.cost,
            limits=applicable(dataset, user, request.notebook, groups),
            groups=groups,
            sql=request.label,
            replay_key=analysis.replay_key,
            accountant=self.accountants[dataset.name],
        )

        def run() -> Answer:
            # The one place a query reads the private data: marked before the read, so
            # whatever follows (a release, a failure, a refusal) is padded.
            reads.begin()
            return execute(analysis.analysed, self.databases[dataset.name])

        try:
            return charge, self._admissions[dataset.name].run(user, run, OutOfResources)
        except GateError as exc:
            self.ledger.record_failure(charge)
            raise Failed(exc.message) if not isinstance(exc, Failed) else exc from None
        except Exception as exc:
            # The text of a DuckDB error may quote data; only its type is logged.
            log.error("query failed after the debit: %s", type(exc).__name__)
            self.ledger.record_failure(charge)
            raise Failed() from None

    def _within_failures(self, user: str, dataset: Dataset) -> None:
        """Refuse, free, a user whose queries on ``dataset`` failed after the debit
        ``max_resource_failures`` times in the last day: a query tuned to the edge of
        the time or memory limit is the one way left for one unit's bounded work to
        show (docs/security.md), and it takes many tries (``interface.drawn_timeout``)."""
        failed = self.ledger.recent_failures(user, dataset.name, FAILURE_WINDOW_S)
        if failed >= dataset.max_resource_failures:
            raise Refused(
                f"{failed} of your queries on {dataset.name!r} ran out of time or memory in "
                f"the last 24 hours, the policy's max_resource_failures: the gate runs none "
                "of yours there until a day has passed since the oldest, or the owner "
                "resets your budget; nothing was charged"
            )

    def budget(
        self,
        user: str,
        dataset: str | None,
        notebook: str | None,
        preview: PreviewRequest | None = None,
    ) -> dict[str, object]:
        """``GET /v1/budget``: the user's and the notebook's views, at the top level, and
        with ``preview`` what more queries of each kind they allow (``gate/preview.py``):
        planned as this engine plans a request, counted against every budget the debit
        checks (``scopes.applicable``), reading no data."""
        ds = self._dataset(dataset)
        nb = notebook or "unnamed"
        views = self._budget_views(user, ds, nb)
        reply: dict[str, object] = {"dataset": ds.name, **views.json()}
        if preview is not None:
            limits = applicable(ds, user, nb, self.membership.of(user))
            standings = self.ledger.standing(limits)
            accountant = self.accountants[ds.name]
            analyse = partial(self.analyse, ds)
            reply["preview"] = utility_preview(ds, accountant, analyse, standings, preview)
        return reply

    def history(
        self, user: str, dataset: str | None, notebook: str | None, limit: int
    ) -> dict[str, object]:
        """``GET /v1/history``: the calling user's own queries in one notebook, oldest first.

        Only what the user already saw: their SQL, its time, its cost and what
        became of it; never a stored answer, never another user's line.
        Without a dataset it covers all of them, and names them, so a client
        can show every budget without knowing the policy.
        """
        name = None if dataset is None else self._dataset(dataset).name
        nb = notebook or "unnamed"
        rows = self.ledger.history(
            user=user, dataset=name, notebook=nb, limit=limit, refusals=False
        )
        entries = history_entries(rows)
        datasets = sorted(self.policy.datasets) if name is None else [name]
        return {"datasets": datasets, "notebook": nb, "entries": entries}

    def schema(self, dataset: str | None) -> dict[str, object]:
        ds = self._dataset(dataset)
        out = ds.as_dict()
        out["datasets"] = sorted(self.policy.datasets)
        out["count_error"] = count_error(ds)
        return out

    def _dataset(self, name: str | None) -> Dataset:
        try:
            return self.policy.dataset(name)
        except PolicyError as exc:
            raise BadRequest(str(exc)) from None

    def _budget_views(self, user: str, dataset: Dataset, notebook: str) -> protocol.Budgets:
        """The user's and the notebook's budget views, as a reply and ``/v1/budget``
        carry them."""
        groups = self.membership.of(user)
        return budget_views(self.ledger, user, dataset, notebook, groups)

    def _replay_key(self, dataset: Dataset, the_plan: Plan, request: QueryRequest) -> ReplayKey:
        """The query's own key (what is asked, how it is answered), joined by the
        versions of the data and of the policy facts the plan read (``engines/versions.versions``:
        the dataset's settings and the declarations of the tables it scans), so that a
        changed data file or bound never replays an answer computed before it."""
        identity: dict[str, object] = {
            "v": ANSWER_VERSION,
            "dataset": dataset.name,
            "sql": the_plan.checked.resolved.canonical,
            "params": request.params,
            "cost": the_plan.cost.as_dict(),
            "accuracy": None if the_plan.accuracy is None else vars(the_plan.accuracy),
            "mechanisms": [m.noise.mechanism for m in the_plan.measurements]
            + [s.noise.mechanism for s in the_plan.selections],
        }
        if request.bounding_report is not None:
            # Only then: the keys of answers stored without a report stay what they were.
            identity["bounding_report"] = request.bounding_report
        if request.stage is not None:
            # Which release of a clipped query, and for the second the clip it read.
            identity["clip"] = repr(request.stage)
        if dataset != self.policy.datasets.get(dataset.name):
            # Tightened by the request: only then, so the keys of answers under the
            # policy's own bounds stay what they were.
            identity["bounds"] = [dataset.max_partitions, dataset.max_rows_per_partition]
        text = json.dumps(identity, sort_keys=True, default=str)
        query = hashlib.sha256(text.encode()).hexdigest()
        resolved = the_plan.checked.resolved
        scans = [*resolved.scans, *(s for j in resolved.semijoins for s in j.scans)]
        versions = self.databases[dataset.name].versions
        policy = versions.policy(frozenset(s.table.name for s in scans))
        return ReplayKey(query, versions.data, policy)


def text_key(dataset: Dataset, request: QueryRequest) -> str | None:
    """Everything a request's analysis is a function of besides the policy (fixed for
    the engine's life), as one hash: its text, parameters, asked budget and accuracy,
    report, tightened bounds and stage. None for parameters a JSON body cannot carry."""
    eps, delta = asked_budget(dataset, request)
    try:
        params = json.dumps(request.params, sort_keys=True)
    except (TypeError, ValueError):
        return None
    parts = [dataset.name, request.sql, params, eps, delta, request.accuracy, request.alpha,
             request.bounding_report, dataset.max_partitions, dataset.max_rows_per_partition,
             repr(request.stage)]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()


def _hint_scopes(user: str, dataset: Dataset, groups: frozenset[str]) -> list[Scope]:
    """Whom a release to ``user`` in ``groups`` is served to, and so whose replies its
    hint may speed up: the user, and where the dataset shares, those it shares with."""
    return [
        replay_hints.own(dataset.name, user),
        *replay_hints.sharing_scopes(dataset.name, dataset.share_releases, groups),
    ]


def plan_request(dataset: Dataset, accountant: Accountant, request: QueryRequest) -> Plan:
    """A request's plan, with the dataset's defaults filled in (``pipeline.analyse``):
    a function of the request, the policy and the accountant alone, which the owner's
    tools (``owner.preview``) call as the engine does."""
    epsilon, delta = asked_budget(dataset, request)
    accuracy = None
    if request.accuracy is not None:
        accuracy = Accuracy(request.accuracy, request.alpha)
    asked = Asked(
        request.sql,
        # The body's values as it sent them; the parse refuses any that is not a Param.
        cast(dict[str, Param], request.params),
        epsilon,
        delta,
        accuracy,
        request.bounding_report,
        request.stage,
    )
    try:
        return analyse(asked, dataset, accountant)
    except AccountantError as exc:
        raise BadRequest(str(exc)) from None


def _envelope(dataset: Dataset, analysis: Analysis, request: QueryRequest) -> QueryReply:
    """What every reply to ``request`` says before any data is read: the cost, the plan,
    the bounds it is answered under, and what was asked (the policy's defaults filled
    in), with a clipped query's choice of bounds."""
    the_plan = analysis.plan
    eps, delta = asked_budget(dataset, request)
    # What was asked, with the policy's defaults filled in: a transcript of released
    # answers is matched on it where no gate can analyse. Each release of a clipped
    # query echoes the whole ε asked, the first two marked so that a transcript tells
    # the three apart.
    clipping = request.whole_epsilon is not None
    asked = protocol.Asked(
        sql=request.sql,
        params=request.params,
        epsilon=request.whole_epsilon if clipping else eps,
        delta=delta,
        accuracy=request.accuracy,
        alpha=None if request.accuracy is None else request.alpha,
        bounding_report=request.bounding_report,
        max_partitions=request.max_partitions,
        max_rows_per_partition=request.max_rows_per_partition,
        clip=request.clip,
        clip_bounds=True if clipping and isinstance(request.stage, ClipBounds) else None,
        clip_moved=True if clipping and isinstance(request.stage, ClipMoved) else None,
    )
    reply = QueryReply(
        dataset=dataset.name,
        engine=dataset.engine,
        cost=wire_cost(the_plan.cost),
        plan=summary(the_plan),
        # The bounds the answer is over, said before any data is read: a dry run
        # names the bounds a query will be answered under.
        bounding=analysis.bounds,
        dry_run=request.dry_run,
        request=asked,
    )
    people = [s.per_unit for s in the_plan.checked.resolved.scans if s.per_unit is not None]
    if people:
        # Where each per-person value lies, and why: decided from the text and the policy.
        reply.per_person = [
            protocol.PerPerson(value=name, bounds=[b.lo, b.hi], basis=basis)
            for per in people
            for (name, _), b, basis in zip(per.values, per.bounds, per.bases, strict=True)
            if not name.startswith("__")
        ]
    if isinstance(request.stage, Clipped):
        # Which bounds were used and why, what the cells hold, the values moved.
        share = required(request.clip, "the clip's share")
        whole = required(request.whole_epsilon, "a clipped query's ε")
        reply.clip = clip_releases.facts(request.stage, share, whole)
    return reply


def wire_cost(cost: Cost) -> protocol.Cost:
    """A cost as the reply carries it (``Cost.as_dict``: ρ only where it states one)."""
    return protocol.Cost(**cost.as_dict())


def _estimated_bytes(analysis: Analysis) -> int:
    """What keeping ``analysis`` costs, estimated from its texts
    (``analysis_cache.BYTES_PER_CHAR``)."""
    report = analysis.analysed.report
    chars = len(analysis.rewritten.sql) + (0 if report is None else len(report.sql))
    return BYTES_PER_CHAR * (chars + len(analysis.plan.checked.resolved.canonical))


# What the schema's bounds cost, stated as a count's 95% error at this ε: a figure an
# owner and an analyst can weigh a bound by (``count_error``).
ERROR_EPSILON = 1.0


def count_error_of(rows: int) -> int:
    """The 95% error of a noisy count at ε = 1 (Laplace) when one unit adds ``rows``."""
    return int(calibrate(rows, ERROR_EPSILON).half_width(REPORT_ALPHA))


def count_error(dataset: Dataset) -> dict[str, object]:
    """What the dataset's contribution bounds cost, as the 95% error of a noisy count at
    ε = 1 with Laplace noise (pure DP): without a ``GROUP BY`` a unit adds at most
    ``max_rows_per_partition`` rows, with one ``max_partitions ×
    max_rows_per_partition``; a table that declares ``max_rows_per_unit`` at most that
    many. From the policy alone: ``/v1/schema`` sends it, ``%dpschema`` and
    ``dpmagic init``'s comments show it."""

    error = count_error_of
    unit = dataset.privacy_unit is not None
    one = dataset.max_rows_per_partition if unit else 1
    grouped = dataset.max_partitions * dataset.max_rows_per_partition if unit else 1
    tables = {
        t.name: {
            "ungrouped": error(min(one, t.max_rows)),
            "grouped": error(min(grouped, t.max_rows)),
        }
        for t in dataset.tables.values()
        if t.max_rows is not None
    }
    return {
        "epsilon": ERROR_EPSILON,
        "alpha": REPORT_ALPHA,
        "ungrouped": error(one),
        "grouped": error(grouped),
        "tables": tables,
    }
