"""Budgets many users share, on real ledger files: the dataset's, a group's; renewing
budgets; shared releases. The races between processes are in test_budget_races.py."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.dp.accounting import Cost, PureAccountant
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.ledger.replays import DATA_CHANGED, ReplayKey
from dpmagic.gate.ledger.scopes import RENEWED, RENEWS, Scope, next_period, period_label
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Budget
from dpmagic.gate.policy.values import Period
from dpmagic.gate.reply import Reply
from dpmagic.protocol import BudgetName, QueryReply

BIG = Budget(100.0)
WHOLE = Scope.whole("d")


class Clock:
    """A settable time for the ledger, in UTC."""

    def __init__(self, when: datetime) -> None:
        self.when = when

    def __call__(self) -> datetime:
        return self.when


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 11, 26, 12, 0, tzinfo=UTC))


@pytest.fixture
def ledger(tmp_path: Path, clock: Clock):
    led = Ledger(tmp_path / "state" / "ledger.sqlite3", PureAccountant(), clock)
    yield led
    led.close()


def limits(
    user: str,
    *,
    notebook: str = "n.ipynb",
    dataset: Budget | None = None,
    group_caps: dict[str, Budget] | None = None,
    user_cap: Budget = BIG,
) -> list[tuple[Scope, Budget]]:
    out = [] if dataset is None else [(WHOLE, dataset)]
    out += [(Scope.group("d", g), b) for g, b in sorted((group_caps or {}).items())]
    out += [(Scope.user("d", user), user_cap), (Scope.of_notebook("d", user, notebook), BIG)]
    return out


def charge(ledger: Ledger, user: str, epsilon: float, groups: tuple[str, ...] = (), **kw):
    return ledger.debit(
        user=user,
        dataset="d",
        notebook=kw.get("notebook", "n.ipynb"),
        cost=Cost(epsilon),
        limits=limits(user, **{k: v for k, v in kw.items() if k != "key"}),
        groups=groups,
        sql=f"SELECT {epsilon}",
        replay_key=kw.get("key"),
    )


def test_the_dataset_budget_counts_every_user_and_refusal_names_it(ledger: Ledger) -> None:
    cap = Budget(1.0)
    for user in ("ann", "bob", "cat", "dan"):
        charge(ledger, user, 0.25, dataset=cap)
    with pytest.raises(OverBudget) as refused:
        charge(ledger, "eve", 0.25, dataset=cap)  # eve has spent nothing of her own
    assert refused.value.budget == BudgetName(budget="dataset", dataset="d")
    assert "of the dataset budget of 'd' (all users together)" in str(refused.value)
    assert refused.value.as_reply()["error"]["budget"] == {"budget": "dataset", "dataset": "d"}
    assert ledger.standing([(WHOLE, cap)]) == [(Cost(1.0), cap)]
    assert ledger.spent("eve", "d") == Cost(0.0)  # the refusal wrote nothing


def test_a_group_budget_counts_its_members_at_the_time_of_each_charge(ledger: Ledger) -> None:
    cap = {"sec-a": Budget(0.5)}
    charge(ledger, "ann", 0.25, ("sec-a",), group_caps=cap)
    charge(ledger, "bob", 0.25, ("sec-a",), group_caps=cap)
    charge(ledger, "cat", 0.25, ("sec-b",))  # another group's: not counted in sec-a
    with pytest.raises(OverBudget) as refused:
        charge(ledger, "ann", 0.1, ("sec-a",), group_caps=cap)
    assert refused.value.budget == BudgetName(
        **{"budget": "group", "dataset": "d", "holder": "sec-a"}
    )
    # ann leaves sec-a: her past spending stays counted there; her new queries are not.
    charge(ledger, "ann", 0.5)
    a = Scope.group("d", "sec-a")
    assert ledger.standing([(a, cap["sec-a"])]) == [(Cost(0.5), cap["sec-a"])]


def test_the_first_exhausted_budget_is_named_from_the_widest(ledger: Ledger) -> None:
    charge(ledger, "ann", 0.5, ("g",))
    with pytest.raises(OverBudget) as refused:  # all three are exhausted: the dataset's first
        charge(
            ledger, "ann", 0.5, ("g",),
            dataset=Budget(0.6), group_caps={"g": Budget(0.6)}, user_cap=Budget(0.6),
        )  # fmt: skip
    assert refused.value.budget.budget == "dataset"
    with pytest.raises(OverBudget) as refused:
        charge(ledger, "ann", 0.5, ("g",), group_caps={"g": Budget(0.6)}, user_cap=Budget(0.6))
    assert refused.value.budget.budget == "group"
    with pytest.raises(OverBudget, match="for user ann on dataset 'd'"):
        charge(ledger, "ann", 0.5, ("g",), user_cap=Budget(0.6))


def test_grants_and_resets_of_shared_budgets(ledger: Ledger) -> None:
    cap = Budget(0.5)
    charge(ledger, "ann", 0.5, dataset=cap)
    with pytest.raises(OverBudget):
        charge(ledger, "bob", 0.1, dataset=cap)
    ledger.grant(WHOLE, Budget(0.25), "budget grant by owner: term 2")
    assert ledger.limit(WHOLE, cap) == Budget(0.75)
    charge(ledger, "bob", 0.25, dataset=cap)
    ledger.reset(WHOLE, "budget reset by owner: new data")
    assert ledger.standing([(WHOLE, cap)]) == [(Cost(0.0), cap)]
    # A dataset's reset is not a user's: ann's own spending stays.
    assert ledger.spent("ann", "d") == Cost(0.5)
    [reset, grant] = [r for r in ledger.history() if r["scope"] == "dataset"]
    assert (reset["status"], grant["status"]) == ("reset", "granted")
    assert (reset["user"], reset["notebook"]) == ("", "")


def test_a_group_named_like_a_user_is_not_that_user(ledger: Ledger) -> None:
    ledger.grant(Scope.group("d", "ann"), Budget(5.0), "a group called ann")
    assert ledger.limit(Scope.user("d", "ann"), Budget(1.0)) == Budget(1.0)
    ledger.reset(Scope.group("d", "ann"), "")
    charge(ledger, "ann", 0.5)
    assert ledger.spent("ann", "d") == Cost(0.5)


# -- renewal ---------------------------------------------------------------------------


def test_a_daily_budget_renews_each_day_and_the_log_says_so(ledger, clock) -> None:
    daily = Budget(1.0, renew=Period.DAY)
    charge(ledger, "ann", 0.75, dataset=daily)
    with pytest.raises(OverBudget):
        charge(ledger, "bob", 0.5, dataset=daily)
    clock.when += timedelta(days=1)
    assert ledger.standing([(WHOLE, daily)]) == [(Cost(0.0), daily)]  # renewed, as read
    charge(ledger, "bob", 0.5, dataset=daily)
    charge(ledger, "bob", 0.5, dataset=daily)
    with pytest.raises(OverBudget):
        charge(ledger, "bob", 0.5, dataset=daily)
    marks = [(r["status"], r["sql"]) for r in reversed(ledger.history()) if r["scope"]]
    assert marks == [(RENEWS, "day 2026-11-26"), (RENEWED, "day 2026-11-27")]


def test_a_renewal_is_never_retroactive(ledger, clock) -> None:
    """Spending before the budget was made renewing, earlier in the same period,
    stays counted; a budget moved to another period's kind begins it without giving
    anything back."""
    charge(ledger, "ann", 0.75, dataset=Budget(1.0))  # not renewing yet
    monthly = Budget(1.0, renew=Period.MONTH)
    with pytest.raises(OverBudget):
        charge(ledger, "ann", 0.5, dataset=monthly)
    charge(ledger, "ann", 0.25, dataset=monthly)  # fits: 1.0 this month
    weekly = Budget(1.0, renew=Period.WEEK)
    with pytest.raises(OverBudget):  # made weekly mid-week: this month's spending stays
        charge(ledger, "ann", 0.25, dataset=weekly)
    charge(ledger, "ann", 0.0, dataset=weekly)  # a charge that fits begins the weeks
    clock.when += timedelta(days=7)
    charge(ledger, "ann", 1.0, dataset=weekly)
    statuses = [r["status"] for r in reversed(ledger.history()) if r["scope"]]
    assert statuses == [RENEWS, RENEWS, RENEWED]


def test_a_renewal_keeps_the_owners_grants(ledger, clock) -> None:
    daily = Budget(1.0, renew=Period.DAY)
    ledger.grant(WHOLE, Budget(1.0), "for the exam")
    charge(ledger, "ann", 2.0, dataset=daily)
    clock.when += timedelta(days=1)
    charge(ledger, "ann", 2.0, dataset=daily)


@pytest.mark.parametrize(
    ("period", "when", "label", "following"),
    [
        (Period.DAY, datetime(2026, 12, 31, 23, 59, tzinfo=UTC), "day 2026-12-31", "2027-01-01"),
        (Period.WEEK, datetime(2026, 11, 26, tzinfo=UTC), "week 2026-W48", "2026-11-30"),
        (Period.WEEK, datetime(2026, 11, 30, tzinfo=UTC), "week 2026-W49", "2026-12-07"),
        (Period.WEEK, datetime(2027, 1, 1, tzinfo=UTC), "week 2026-W53", "2027-01-04"),
        (Period.MONTH, datetime(2026, 12, 5, tzinfo=UTC), "month 2026-12", "2027-01-01"),
    ],
)
def test_periods(period: Period, when: datetime, label: str, following: str) -> None:
    assert period_label(period, when) == label
    assert next_period(period, when) == f"{following}T00:00:00+00:00"
    after = datetime.fromisoformat(next_period(period, when))
    assert period_label(period, after) != label
    assert period_label(period, after - timedelta(microseconds=1)) == label


# -- shared releases ---------------------------------------------------------------------
#
# The rule (docs/privacy.md, "Shared releases"): a release is served to a user only
# where it counts against every budget they are under: the dataset's (every release
# does), each of their groups' and their own. What it does not count against yet is
# charged as it is served, checked as a debit is; a user who learned it is served it
# again free. The case: g1 = [ann, bob], g2 = [bob, cat].

G1, G2 = {"g1": Budget(1.0)}, {"g2": Budget(1.0)}
BOTH = {**G1, **G2}
MEMBERS = {"ann": ("g1",), "bob": ("g1", "g2"), "cat": ("g2",), "dan": ("g3",)}


def serve(ledger: Ledger, user: str, key: str, *, everyone: bool = False, **kw):
    """``user`` asks the question ``key``: served another's release, or None."""
    return ledger.serve_shared(
        user=user,
        dataset="d",
        notebook="n.ipynb",
        replay_key=key,
        groups=MEMBERS[user],
        everyone=everyone,
        limits=limits(user, **kw),
        sql=f"ask {key}",
    )


def release(ledger: Ledger, user: str, epsilon: float, key: str, **kw) -> int:
    """``user`` asks ``key`` afresh: charged to every budget they are under, released."""
    charged = charge(ledger, user, epsilon, MEMBERS[user], key=key, **kw)
    ledger.record_release(charged, Reply.of(QueryReply(rows=[[key]])))
    return charged.id


def spent(ledger: Ledger, *scopes: Scope) -> list[float]:
    return [cost.epsilon for cost, _ in ledger.standing([(s, BIG) for s in scopes])]


def test_each_group_pays_for_what_its_members_learn(ledger: Ledger) -> None:
    """ann spends g1's whole budget on ten questions; bob, in g1 and g2, asks the same
    ten: each is served ann's answer and charged to g2 and to bob, never to g1 or the
    dataset again; cat, in g2, then asks one of them: g2 has paid for it, cat has not;
    and cat's new question finds g2's budget spent (free sharing let it reach ε 2.0
    of releases against its 1.0)."""
    g1, g2 = Scope.group("d", "g1"), Scope.group("d", "g2")
    keys = [f"q{i}" for i in range(10)]
    firsts = [release(ledger, "ann", 0.1, k, group_caps=G1, dataset=Budget(5.0)) for k in keys]
    with pytest.raises(OverBudget):
        release(ledger, "ann", 0.1, "more", group_caps=G1)
    for key, first in zip(keys, firsts, strict=True):
        served = serve(ledger, "bob", key, group_caps=BOTH, dataset=Budget(5.0))
        assert served is not None and served.entry_id == first
        assert served.reply.json()["rows"] == [[key]]  # ann's numbers
        assert served.charged == Cost(0.1) and served.cost == Cost(0.1)
        assert set(served.charged_to) == {
            g2,
            Scope.user("d", "bob"),
            Scope.of_notebook("d", "bob", "n.ipynb"),
        }
    assert spent(ledger, WHOLE, g1, g2) == pytest.approx([1.0, 1.0, 1.0])
    assert ledger.spent("bob", "d") == Cost(pytest.approx(1.0))
    served = serve(ledger, "cat", "q3", group_caps=G2)
    assert served is not None and served.entry_id == firsts[3] and served.charged == Cost(0.1)
    assert served.charged_to == (Scope.user("d", "cat"), Scope.of_notebook("d", "cat", "n.ipynb"))
    assert spent(ledger, WHOLE, g1, g2) == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(OverBudget) as refused:
        release(ledger, "cat", 0.1, "new", group_caps=G2)
    assert refused.value.budget == BudgetName(budget="group", dataset="d", holder="g2")
    # The log says what each was charged, where, and whose release it served.
    rows = ledger.history(user="bob", status="replayed")
    assert len(rows) == 10 and {r["source"] for r in rows} == set(firsts)
    assert all(r["epsilon"] == 0.1 and r["groups"] == ["g2"] for r in rows)


def test_a_serving_that_does_not_fit_is_refused_and_writes_nothing(ledger: Ledger) -> None:
    """Each budget serving would charge is checked as a debit checks it, the refusal
    names the first that cannot pay, and nothing is written."""
    release(ledger, "ann", 0.5, "k")
    release(ledger, "cat", 0.75, "other", group_caps=G2)  # g2: 0.25 left
    before = len(ledger.history())
    with pytest.raises(OverBudget) as refused:
        serve(ledger, "bob", "k", group_caps=BOTH)
    assert refused.value.budget == BudgetName(budget="group", dataset="d", holder="g2")
    with pytest.raises(OverBudget, match="for user bob"):
        serve(ledger, "bob", "k", user_cap=Budget(0.25))
    with pytest.raises(OverBudget, match=r"for notebook 'n\.ipynb'"):
        ledger.serve_shared(
            user="bob", dataset="d", notebook="n.ipynb", replay_key="k", groups=("g1",),
            everyone=False, sql="q",
            limits=[(Scope.user("d", "bob"), BIG), (Scope.of_notebook("d", "bob", "n.ipynb"),
                                                     Budget(0.25))],
        )  # fmt: skip
    assert len(ledger.history()) == before
    assert ledger.spent("bob", "d") == Cost(0.0)
    # A dataset's budget spent to the last does not refuse it: it counts the release.
    assert serve(ledger, "bob", "k", dataset=Budget(1.25)) is not None


def test_a_user_who_learned_a_release_is_served_it_again_free_and_never_another(
    ledger: Ledger,
) -> None:
    first = release(ledger, "ann", 0.5, "k")
    served = serve(ledger, "bob", "k")
    assert served is not None and served.charged == Cost(0.5)
    later = release(ledger, "cat", 0.5, "k")  # cat, in g2 alone then, asked afresh
    again = serve(ledger, "bob", "k")  # bob: in g2 too, and he knows ann's answer
    assert again is not None and again.entry_id == first
    assert again.charged == Cost(0.0) and again.charged_to == ()
    assert ledger.spent("bob", "d") == Cost(0.5)
    # Everyone's: the first release for a newcomer, the one they learned for others.
    assert serve(ledger, "dan", "k", everyone=True).entry_id == first
    assert serve(ledger, "cat", "k", everyone=True) is not None  # cat's own: not shared
    [cats] = ledger.history(user="cat", status="replayed")
    assert cats["source"] == later and cats["epsilon"] == 0.0


def test_who_may_be_served_a_release_under_group_sharing(ledger: Ledger) -> None:
    """A release is served to a member of a group it counts against: one it was
    charged to when released, or when served to a member who had not learned it."""
    first = release(ledger, "ann", 0.5, "k")
    assert serve(ledger, "cat", "k") is None  # g2: not charged with it yet
    assert serve(ledger, "dan", "k") is None
    assert serve(ledger, "bob", "k", group_caps=BOTH) is not None  # charges g2
    served = serve(ledger, "cat", "k", group_caps=BOTH)
    assert served is not None and served.entry_id == first
    assert served.charged_to == (Scope.user("d", "cat"), Scope.of_notebook("d", "cat", "n.ipynb"))
    assert spent(ledger, Scope.group("d", "g2")) == [0.5]
    assert serve(ledger, "dan", "k") is None and serve(ledger, "ann", "other") is None
    assert serve(ledger, "dan", "k", everyone=True).entry_id == first


def test_an_older_gates_free_serving_charges_nothing_and_is_charged_when_asked_again(
    ledger: Ledger,
) -> None:
    """A replay row an earlier gate wrote for a shared release (zero cost, no groups)
    counts nowhere: its user had not paid, so a new ask is charged."""
    first = release(ledger, "ann", 0.5, "k")
    ledger.record_replay(
        user="bob", dataset="d", notebook="n.ipynb", sql="q", replay_key="k", source=first
    )
    assert ledger.spent("bob", "d") == Cost(0.0)
    assert spent(ledger, WHOLE) == [0.5]
    served = serve(ledger, "bob", "k", group_caps=BOTH)
    assert served is not None and served.charged == Cost(0.5)
    [replay, _old] = ledger.history(user="bob", status="replayed")
    assert ledger.reply(int(replay["id"]))["rows"] == [["k"]]  # what bob was served


# What a sequence of asks must leave in every budget: each release counted once in
# each scope whose holder learned it (a group: while a member), and nowhere else.
_ASKS = st.lists(
    st.tuples(
        st.sampled_from(["ann", "bob", "cat", "dan"]),
        st.sampled_from([(), ("g1",), ("g2",), ("g1", "g2"), ("g2", "g3")]),  # groups now
        st.sampled_from(["k", "k", "j"]),
        st.booleans(),  # fresh: a new release, whatever exists
    ),
    max_size=12,
)


@pytest.mark.search
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(asks=_ASKS, everyone=st.booleans())
def test_every_scope_counts_each_release_its_holders_learned_once(
    tmp_path: Path, asks, everyone: bool
) -> None:
    """Asks by users whose groups change between asks, of two questions, some fresh,
    as the engine makes them (own answer, else a shared one, else a new release): each
    budget's standing is exactly the releases its holders learned, each once: the
    dataset every release, a group each one a member learned while a member (released
    to them or first served them), a user each one they learned; so the running
    tallies read, and so a handle reading the whole log afresh. Each release's cost
    is its own power of 4, so a standing names the releases it counts, and how often.
    Also: a user is never served a release they did not learn while they know one of
    the question, nor one not yet counting against any group of theirs under group
    sharing, and no release is made where a user could have been served one."""
    led = Ledger(tmp_path / f"{uuid.uuid4().hex}.sqlite3", PureAccountant())
    everyone_scopes = {"d": set()}
    learned: dict[str, set[int]] = {}  # scope name -> releases it must count
    cost: dict[int, float] = {}
    releases: dict[str, list[int]] = {}  # key -> its releases
    counts: dict[int, set[str]] = {}  # release -> groups it counts against (the model's)
    known: dict[str, set[int]] = {}  # user -> releases they learned
    mine: dict[str, dict[str, int]] = {}  # user -> key -> their own latest release

    def learn(user: str, groups: tuple[str, ...], rid: int) -> None:
        known.setdefault(user, set()).add(rid)
        learned.setdefault(f"user {user}", set()).add(rid)
        for g in groups:
            learned.setdefault(f"group {g}", set()).add(rid)
            counts[rid].add(g)

    try:
        for user, groups, key, fresh in asks:
            lims = [
                (WHOLE, BIG),
                *((Scope.group("d", g), BIG) for g in groups),
                (Scope.user("d", user), BIG),
                (Scope.of_notebook("d", user, "n"), BIG),
            ]
            if not fresh and key in mine.get(user, {}):
                continue  # the engine replays it, free, touching no budget
            served = None
            if not fresh:
                served = led.serve_shared(
                    user=user, dataset="d", notebook="n", replay_key=key, groups=groups,
                    everyone=everyone, limits=lims, sql=key,
                )  # fmt: skip
                mine_of_key = known.get(user, set()) & set(releases.get(key, []))
                eligible = [
                    r for r in releases.get(key, [])
                    if r in mine_of_key or everyone or counts[r] & set(groups)
                ]  # fmt: skip
                assert (served is None) == (not eligible)
            if served is not None:
                rid = served.entry_id
                assert rid in eligible
                if mine_of_key:
                    assert rid in mine_of_key and served.charged == Cost(0.0)
                else:
                    assert served.charged == Cost(cost[rid])
                    learn(user, groups, rid)
                continue
            epsilon = 4.0 ** -(len(cost) + 1)
            debited = led.debit(
                user=user, dataset="d", notebook="n", cost=Cost(epsilon), limits=lims,
                groups=groups, sql=key, replay_key=key,
            )  # fmt: skip
            led.record_release(debited, Reply.of(QueryReply(rows=[[debited.id]])))
            cost[debited.id] = epsilon
            counts[debited.id] = set()
            releases.setdefault(key, []).append(debited.id)
            mine.setdefault(user, {})[key] = debited.id
            everyone_scopes["d"].add(debited.id)
            learn(user, groups, debited.id)
        scopes = {"dataset": WHOLE}
        scopes |= {f"group {g}": Scope.group("d", g) for g in ("g1", "g2", "g3")}
        scopes |= {f"user {u}": Scope.user("d", u) for u in MEMBERS}
        learned["dataset"] = everyone_scopes["d"]
        # The running tallies, and a handle reading the whole log afresh, alike.
        fresh = Ledger(led.path, PureAccountant())
        try:
            for name, scope in scopes.items():
                want = sum(cost[r] for r in learned.get(name, set()))
                for handle in (led, fresh):
                    [(got, _)] = handle.standing([(scope, BIG)])
                    assert got.epsilon == want, (name, got.epsilon, sorted(learned.get(name, ())))
        finally:
            fresh.close()
    finally:
        led.close()


# -- the running tallies against a fresh reading, every scope -----------------------------

_USERS = ("ann", "bob")
_SCOPES = [
    WHOLE,
    Scope.group("d", "g"),
    Scope.group("d", "h"),
    *(Scope.user("d", u) for u in _USERS),
    *(Scope.of_notebook("d", u, nb) for u in _USERS for nb in ("a", "b")),
]
_BASE = Budget(1000.0, renew=Period.DAY)
_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["debit", "grant", "reset", "day"]),
        st.sampled_from(_SCOPES),  # a debit: its user and notebook (or ann's "a")
        st.sampled_from([(), ("g",), ("g", "h")]),  # a debit's groups
        st.sampled_from([0, 1]),  # which of two handles on the file (two processes)
        st.sampled_from([None, *_SCOPES]),  # the scope read after it
    ),
    max_size=25,
)


def _scope_tallies_agree(tmp_path, actions) -> None:
    """Whatever mix of debits (with groups), grants, resets and days passing two handles
    on one ledger write, and whenever each scope is first read, each handle's standing
    of every scope (dataset, groups, users, notebooks; renewing daily) equals the one a
    handle opened afresh computes from the whole log."""
    path = tmp_path / f"{uuid.uuid4().hex}.sqlite3"
    clock = Clock(datetime(2026, 11, 26, 12, tzinfo=UTC))
    handles = [Ledger(path, PureAccountant(), clock) for _ in range(2)]

    def check(scope: Scope) -> None:
        fresh = Ledger(path, PureAccountant(), clock)
        try:
            expected = fresh.standing([(scope, _BASE)])
        finally:
            fresh.close()
        for led in handles:
            assert led.standing([(scope, _BASE)]) == expected

    try:
        for action, scope, groups, which, probe in actions:
            led = handles[which]
            if action == "debit":
                user = scope.holder if scope.holder in _USERS else "ann"
                notebook = scope.notebook or "a"
                led.debit(
                    user=user,
                    dataset="d",
                    notebook=notebook,
                    cost=Cost(0.25),
                    limits=[
                        (WHOLE, _BASE),
                        *((Scope.group("d", g), _BASE) for g in groups),
                        (Scope.user("d", user), _BASE),
                        (Scope.of_notebook("d", user, notebook), _BASE),
                    ],
                    groups=groups,
                    sql="q",
                    replay_key=None,
                )
            elif action == "grant":
                led.grant(scope, Budget(0.5), "")
            elif action == "reset":
                led.reset(scope, "")
            else:
                clock.when += timedelta(days=1)
            if probe is not None:
                check(probe)
        for scope in _SCOPES:
            check(scope)
    finally:
        for led in handles:
            led.close()


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=_ACTIONS)
def test_running_tallies_of_every_scope_agree_with_a_fresh_reading(tmp_path, actions) -> None:
    """A few examples in the default run; the search below tries 60."""
    _scope_tallies_agree(tmp_path, actions)


@pytest.mark.search
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=_ACTIONS)
def test_running_tallies_of_every_scope_agree_with_a_fresh_reading_searched(
    tmp_path, actions
) -> None:
    _scope_tallies_agree(tmp_path, actions)


def test_a_shared_budgets_refusal_says_why_the_users_answer_was_not_replayed(ledger) -> None:
    """The reason is the asker's own (their earlier release), whichever budget refused."""
    before = ReplayKey("q", "data v1", "policy v1")
    released = charge(ledger, "ann", 0.5, dataset=Budget(0.75), key=before)
    ledger.record_release(released, Reply.of(QueryReply(rows=[[1]])))
    after = ReplayKey("q", "data v2", "policy v1")
    with pytest.raises(OverBudget) as refused:
        charge(ledger, "ann", 0.5, dataset=Budget(0.75), key=after)
    assert refused.value.budget == BudgetName(budget="dataset", dataset="d")
    assert str(refused.value).endswith("; not replayed: " + DATA_CHANGED)


def _serve_race(path: str, users: list[str], start: float, out) -> None:
    """One process: each of its users asks ``k`` twice, as soon as the race starts."""
    led = Ledger(Path(path), PureAccountant())
    time.sleep(max(0.0, start - time.time()))
    served = []
    for _ in range(2):
        for user in users:
            got = led.serve_shared(
                user=user, dataset="d", notebook="n", replay_key="k", groups=("g1", "g2"),
                everyone=True, sql="k",
                limits=[(WHOLE, BIG), (Scope.group("d", "g1"), BIG),
                        (Scope.group("d", "g2"), BIG), (Scope.user("d", user), BIG),
                        (Scope.of_notebook("d", user, "n"), BIG)],
            )  # fmt: skip
            served.append((user, None if got is None else got.charged.epsilon))
    led.close()
    out.put(served)


@pytest.mark.search  # four spawned processes; each group paying once stays in the default run
def test_processes_serving_one_release_at_once_charge_each_group_once(tmp_path: Path) -> None:
    """Forty users in g1 and g2, in four processes on one ledger file, are served ann's
    release at once, each twice: g1 and g2 are each charged its cost once, whoever was
    first; each user once, on their first ask. What a serving charges is read and
    written in one transaction, so the others read the first's charge."""
    path = tmp_path / "ledger.sqlite3"
    led = Ledger(path, PureAccountant())
    first = led.debit(
        user="ann", dataset="d", notebook="n", cost=Cost(0.5), limits=limits("ann"),
        groups=("g0",), sql="k", replay_key="k",
    )  # fmt: skip
    led.record_release(first, Reply.of(QueryReply(rows=[[1]])))
    led.close()
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = time.time() + 3.0  # after every process has imported and opened the ledger
    procs = [
        context.Process(
            target=_serve_race, args=(str(path), [f"u{p}-{i}" for i in range(10)], start, out)
        )
        for p in range(4)
    ]
    for proc in procs:
        proc.start()
    served = [pair for _ in procs for pair in out.get(timeout=120)]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert sorted(charged for _, charged in served) == [0.0] * 40 + [0.5] * 40
    led = Ledger(path, PureAccountant())
    try:
        g0, g1, g2 = (Scope.group("d", g) for g in ("g0", "g1", "g2"))
        assert spent(led, WHOLE, g0, g1, g2) == [0.5, 0.5, 0.5, 0.5]
        assert {led.spent(u, "d").epsilon for u, _ in served} == {0.5}
    finally:
        led.close()
