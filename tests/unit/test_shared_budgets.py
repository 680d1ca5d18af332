"""Budgets many users share, on real ledger files: the dataset's, a group's; renewing
budgets; shared releases. The races between processes are in test_budget_races.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.dp.accounting import Cost, PureAccountant
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.policy import Budget
from dpmagic.gate.policy.values import Period
from dpmagic.gate.service.budget_scopes import (
    RENEWED,
    RENEWS,
    Scope,
    next_period,
    period_label,
)
from dpmagic.gate.service.ledger import DATA_CHANGED, Ledger, ReplayKey
from dpmagic.gate.service.reply import Reply

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
    assert refused.value.budget == {"budget": "dataset", "dataset": "d"}
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
    assert refused.value.budget == {"budget": "group", "dataset": "d", "holder": "sec-a"}
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
    assert refused.value.budget["budget"] == "dataset"
    with pytest.raises(OverBudget) as refused:
        charge(ledger, "ann", 0.5, ("g",), group_caps={"g": Budget(0.6)}, user_cap=Budget(0.6))
    assert refused.value.budget["budget"] == "group"
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


def test_a_release_is_found_for_everyone_or_for_the_groups_it_was_charged_to(ledger) -> None:
    released = charge(ledger, "ann", 0.5, ("sec-a",), key="k")
    ledger.record_release(released, Reply.of({"rows": [[41]]}))
    later = charge(ledger, "bob", 0.5, ("sec-a",), key="k")  # the same question, afresh
    ledger.record_release(later, Reply.of({"rows": [[43]]}))
    found = ledger.find_shared("d", "k", None)
    assert found is not None and found.entry_id == released.id  # the first: one answer
    assert found.cost == Cost(0.5) and found.reply.json() == {"rows": [[41]]}
    assert ledger.find_shared("d", "k", frozenset({"sec-a", "x"})).entry_id == released.id
    assert ledger.find_shared("d", "k", frozenset({"sec-b"})) is None
    assert ledger.find_shared("d", "k", frozenset()) is None
    assert ledger.find_shared("d", "other", None) is None
    charge(ledger, "cat", 0.5, key="k2")  # charged, never released: nothing to share
    assert ledger.find_shared("d", "k2", None) is None
    ledger.record_replay(
        user="cat", dataset="d", notebook="c", sql="q", replay_key="k", source=found.entry_id
    )
    [replay] = ledger.history(user="cat", status="replayed")
    assert ledger.reply(int(replay["id"])) == {"rows": [[41]]}  # what cat was served


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


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=_ACTIONS)
def test_running_tallies_of_every_scope_agree_with_a_fresh_reading(tmp_path, actions) -> None:
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


def test_a_shared_budgets_refusal_says_why_the_users_answer_was_not_replayed(ledger) -> None:
    """The reason is the asker's own (their earlier release), whichever budget refused."""
    before = ReplayKey("q", "data v1", "policy v1")
    released = charge(ledger, "ann", 0.5, dataset=Budget(0.75), key=before)
    ledger.record_release(released, Reply.of({"rows": [[1]]}))
    after = ReplayKey("q", "data v2", "policy v1")
    with pytest.raises(OverBudget) as refused:
        charge(ledger, "ann", 0.5, dataset=Budget(0.75), key=after)
    assert refused.value.budget == {"budget": "dataset", "dataset": "d"}
    assert str(refused.value).endswith("; not replayed: " + DATA_CHANGED)
