"""The change page: grant to or reset any budget (a dataset's, a group's, a user's or a
notebook's), with a reason the audit log keeps.

The form's fields become the change through ``gate/owner.py`` exactly as the CLI's
options do (``scope_named`` → ``scope_of``, ``amount``, ``grant``/``reset``), and
``owner.apply`` writes it; so a change made here is the same row in the log as the
same change made with ``dpmagic budget``, but for its author's name.

It is made hard to slip (a TA at the end of a lab, in a hurry), on the server first,
so that it holds for a script and a page without JavaScript alike (the pages carry
none, and the Content-Security-Policy forbids any):

- the budget's kind is chosen first, and the form then has only the fields that kind
  uses (a user's: the user; a notebook's: the user and the notebook; a group's: the
  group, from the policy's; the dataset's: none). A field the kind does not use is
  refused, never dropped: a notebook typed for a user's budget would otherwise grant
  to the user's whole budget;
- a grant (or reset) naming a user the gate does not know (``known.py``) is not made
  until it is confirmed, by a second request that names the user it creates
  (``create=NAME``); the page says so and which known names are close;
- a reset is not made until it is confirmed (``confirm=reset``), on a page that says
  what it starts from zero; its button sits apart from Grant, and asks first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from dpmagic.gate import owner
from dpmagic.gate.console.layout import Frame, number, page, url
from dpmagic.gate.failures import OwnerError
from dpmagic.gate.ledger.scopes import ScopeKind
from dpmagic.gate.policy import Budget, Policy

FIELDS = (
    "dataset", "budget", "holder", "notebook", "epsilon", "delta", "reason", "create",
    "confirm",
)  # fmt: skip
# The value of ``confirm`` that confirms a reset.
CONFIRM_RESET = "reset"


@dataclass(frozen=True)
class Kind:
    """A kind of budget as the form offers it: its label, what it is, and which of the
    naming fields (``holder``, ``notebook``) it uses."""

    kind: ScopeKind
    label: str
    what: str
    uses: tuple[str, ...]


KINDS = (
    Kind(ScopeKind.USER, "a user's", "everything one user asks, in every notebook",
         ("holder",)),
    Kind(ScopeKind.NOTEBOOK, "a user's notebook's", "what one user asks in one notebook",
         ("holder", "notebook")),
    Kind(ScopeKind.GROUP, "a group's", "everything a group's members ask together",
         ("holder",)),
    Kind(ScopeKind.DATASET, "the dataset's", "everything all users ask together", ()),
)  # fmt: skip
BY_KIND = {k.kind.value: k for k in KINDS}
CHOOSE = "choose which budget: a user's, a user's notebook's, a group's or the dataset's"


@dataclass(frozen=True)
class ChangeForm:
    """The change form's fields as typed (all text: ``change`` checks them). ``create``
    and ``confirm`` are the confirmation step's (``Confirm``)."""

    dataset: str = ""
    budget: str = ""
    holder: str = ""
    notebook: str = ""
    epsilon: str = ""
    delta: str = ""
    reason: str = ""
    create: str = ""
    confirm: str = ""

    @classmethod
    def read(cls, field: Callable[[str], str | None]) -> ChangeForm:
        """The form from a request's arguments (``field(name)``; missing ones default)."""
        given = {name: value for name in FIELDS if (value := field(name)) is not None}
        return cls(**given)

    def kind(self) -> Kind | None:
        return BY_KIND.get(self.budget)

    def check_fields(self) -> Kind:
        """The kind chosen, or ``OwnerError`` if none is, or if a naming field it does
        not use was given: refused, so that nothing typed is silently dropped."""
        kind = self.kind()
        if kind is None:
            raise OwnerError(
                CHOOSE if not self.budget.strip() else f"no such budget: {self.budget!r}"
            )
        holder, notebook = self.holder.strip(), self.notebook.strip()
        if notebook and "notebook" not in kind.uses:
            if kind.kind == ScopeKind.USER:
                raise OwnerError(
                    f"a user's budget has no notebook, and {notebook!r} was given: to change "
                    f"that notebook's budget, choose \u201ca user's notebook's\u201d; to change "
                    f"{holder or 'the user'}'s whole budget, leave the notebook empty"
                )
            raise OwnerError(
                f"{kind.label} budget has no notebook, and {notebook!r} was given: leave it empty"
            )
        if holder and "holder" not in kind.uses:
            raise OwnerError(
                f"the dataset's budget is all users' together and names nobody, and "
                f"{holder!r} was given: leave it empty, or choose a user's or a group's budget"
            )
        return kind

    def change(self, policy: Policy, action: str, by: str) -> owner.Change:
        """The grant or reset these fields ask for, checked as the CLI checks its own."""
        self.check_fields()
        scope = owner.scope_named(
            policy, self.dataset or None, self.budget, self.holder, self.notebook
        )
        if action == "grant":
            amount = Budget(owner.amount(self.epsilon), owner.amount(self.delta))
            return owner.grant(scope, amount, by, self.reason)
        return owner.reset(scope, by, self.reason)

    def fields(self) -> dict[str, str]:
        """The fields as sent, without the confirmation step's."""
        return {k: v for k, v in asdict(self).items() if k not in ("create", "confirm")}


@dataclass(frozen=True)
class Confirm:
    """What a change waits for before it is made: a new user named (``new_user``, with
    the known names close to it), a reset confirmed, or both; ``standing`` says what a
    reset starts from zero."""

    change: owner.Change
    new_user: str | None = None
    near: tuple[str, ...] = ()
    standing: str | None = None
    asked: tuple[str, ...] = ()  # where the gate looked for the user (``known.sources``)

    def fields(self) -> dict[str, str]:
        """What the confirming request adds to the form's fields."""
        extra = {"create": self.new_user} if self.new_user else {}
        if self.change.action == "reset":
            extra["confirm"] = CONFIRM_RESET
        return extra

    def line(self) -> str:
        """What a script is told (a bearer token's request, which has no page)."""
        asks = " and ".join(f"{k}={v}" for k, v in self.fields().items())
        what = "not granted" if self.change.action == "grant" else "not reset"
        why = f" (no user {self.new_user!r} is known to this gate)" if self.new_user else ""
        return f"{what}{why}: send it again with {asks} to confirm ({self.change.describe()})"


def needs(
    form: ChangeForm,
    change: owner.Change,
    where: str | None,
    near: Sequence[str],
    standing: str | None,
    asked: Sequence[str] = (),
) -> Confirm | None:
    """The confirmation ``change`` still needs, or None. ``where``: where the gate knows
    the change's user from (None: it does not; a group's or the dataset's budget names
    no user)."""
    user = change.scope.holder if change.scope.kind in (ScopeKind.USER, ScopeKind.NOTEBOOK) else ""
    new_user = user if user and where is None and form.create.strip() != user else None
    reset = change.action == "reset" and form.confirm != CONFIRM_RESET
    if new_user is None and not reset:
        return None
    return Confirm(change, new_user, tuple(near) if new_user else (), standing, tuple(asked))


@dataclass(frozen=True)
class KindLink:
    """A kind of budget as a link to its form; ``on`` for the one chosen."""

    href: str
    on: bool
    label: str
    what: str


@dataclass(frozen=True)
class Fields:
    """The chosen kind's form: which naming fields it has (a user's, a notebook's, a
    group from ``groups``, the policy's), and the choices they offer."""

    kind: Kind
    datasets: list[tuple[str, str]]
    user: bool
    notebook: bool
    groups: list[tuple[str, str]] | None  # None: not a group's budget
    users: Sequence[str]


@dataclass(frozen=True)
class Confirming:
    """The confirmation step as the page shows it: the user it would create (with the
    known names close to it, as links to the same form for them, and where the gate
    looked), what a reset starts from zero, and the button that confirms."""

    title: str
    new_user: str | None
    near: list[tuple[str, str]]
    looked: str
    reset: str | None  # the budget a reset starts from zero
    standing: str | None
    typed: bool  # an ε or a δ was typed for a reset, which uses neither
    action: str
    hidden: list[tuple[str, str]]
    button: str
    label: str
    back: str


def change_page(
    frame: Frame,
    policy: Policy,
    form: ChangeForm,
    users: Sequence[str] = (),
    error: str | None = None,
    confirm: Confirm | None = None,
) -> str:
    """The page: the choice of kind, then that kind's form (``users``: the known users,
    offered as the user field's completions); above it an ``error``, or the
    ``confirm`` step a change waits for."""
    kind = form.kind()
    return page(
        frame,
        "change",
        "change.html",
        form=form,
        error=error,
        confirm=_confirming(frame, form, confirm) if confirm else None,
        kinds=_kinds(frame, form),
        fields=_fields(policy, kind, users) if kind else None,
        choose=CHOOSE.capitalize(),
    )


def _kinds(frame: Frame, form: ChangeForm) -> list[KindLink]:
    """The kinds as links, the chosen one marked: choosing one is a page of its own,
    so the form has that kind's fields only. What was typed goes along where the new
    kind uses it (a user's name to their notebook's budget and back)."""
    links = []
    for k in KINDS:
        keep = {"holder": form.holder} if k.uses and _same_holder(form.kind(), k) else {}
        if "notebook" in k.uses:
            keep["notebook"] = form.notebook
        href = url(frame.base, "change", dataset=form.dataset, budget=k.kind.value, **keep)
        links.append(KindLink(href, k.kind.value == form.budget, k.label, k.what))
    return links


def _same_holder(was: Kind | None, then: Kind) -> bool:
    """Whether a holder typed for ``was`` names the same sort of holder in ``then``."""
    users = (ScopeKind.USER, ScopeKind.NOTEBOOK)
    return was is not None and (was.kind in users) == (then.kind in users)


def _fields(policy: Policy, kind: Kind, users: Sequence[str]) -> Fields:
    groups = None
    if kind.kind == ScopeKind.GROUP:
        found = sorted({g for ds in policy.datasets.values() for g in ds.group_budgets})
        groups = [(g, g) for g in found]
    return Fields(
        kind=kind,
        datasets=[(n, n) for n in sorted(policy.datasets)],
        user=kind.kind in (ScopeKind.USER, ScopeKind.NOTEBOOK),
        notebook=kind.kind == ScopeKind.NOTEBOOK,
        groups=groups,
        users=users,
    )


def _confirming(frame: Frame, form: ChangeForm, confirm: Confirm) -> Confirming:
    """The confirmation step: what the change would do and create, the form's fields
    as they were sent (hidden) with what confirms them, and a way back."""
    change = confirm.change
    near = [(url(frame.base, "change", **{**form.fields(), "holder": n}), n) for n in confirm.near]
    if change.action == "reset":
        label = f"Reset {change.scope.describe()}"
        title = "Confirm the reset"
    else:
        assert change.amount is not None
        label = f"Create user {confirm.new_user} and grant ε={change.amount.epsilon:g}"
        if change.amount.delta:
            label += f", δ={change.amount.delta:g}"
        title = "Confirm a new user"
    if confirm.new_user and change.action == "reset":
        label = f"Create user {confirm.new_user} and reset their budget"
    if confirm.new_user and change.scope.kind == ScopeKind.NOTEBOOK:
        label += f" (notebook {change.scope.notebook})"
    reset = change.action == "reset"
    return Confirming(
        title=title,
        new_user=confirm.new_user,
        near=near,
        looked=", ".join(confirm.asked) or "anywhere",
        reset=change.scope.describe() if reset else None,
        standing=confirm.standing,
        typed=reset and bool(form.epsilon.strip() or form.delta.strip()),
        action=change.action,
        hidden=list({**form.fields(), **confirm.fields()}.items()),
        button="danger" if reset else "warn",
        label=label,
        back=url(frame.base, "change", **form.fields()),
    )


def standing_text(standing: owner.Standing | None) -> str | None:
    """What a budget has spent of its limit, for a reset's confirmation."""
    if standing is None:
        return None
    return (
        f"spent ε={number(standing.spent.epsilon)} of its limit ε={number(standing.limit.epsilon)}"
    )
