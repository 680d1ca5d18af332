"""The console's HTTP server: who is asking, whether they may, and which page.

Tornado, because it is already a base dependency of dpmagic (the gate serves on it),
so the console runs wherever the gate does with nothing more installed; and because
JupyterHub's OAuth for services is a tornado mixin (``HubOAuthenticated``), so on a
Hub the same handler serves the Hub's admins (``hub.py``). One handler serves every
page of the console: the Hub's mixin then applies to all of them at once.

Every request is checked here before a page is drawn:

- its ``Host`` must name an address the console serves (``hosts.py``), or it is
  answered a bare 400 before anything else is read;
- who: a session cookie (from the one-time login URL printed to the gate's Unix
  user, or an admin token typed into the sign-in form), an admin token as
  ``Authorization: Bearer``, or on a Hub its OAuth cookie (``hub.py``). Anyone else is
  answered 403 with the sign-in form and nothing of the ledger or the policy;
- a POST (a change, signing in or out) must come from the console's own pages
  (``guards.py``: its session's CSRF token and its Origin), or it is refused
  before anything is read or written; a GET never changes the ledger;
- the pages carry no script, and the Content-Security-Policy forbids any, nor may
  another site frame them (a grant's button under a decoy).

The console reads the ledger on the event loop: reads of a local SQLite file in WAL
mode, which the gate's writes do not block, for one owner's page at a time.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tornado.ioloop import IOLoop
from tornado.web import Application, HTTPError, RequestHandler

from dpmagic.gate import owner
from dpmagic.gate.console.budgets import budgets_page
from dpmagic.gate.console.changes import ChangeForm, change_page, needs, standing_text
from dpmagic.gate.console.guards import CSRF_FIELD, csrf_ok, same_origin
from dpmagic.gate.console.hosts import Hosts
from dpmagic.gate.console.known import known_where, listed_users, near, sources
from dpmagic.gate.console.layout import Frame, message, render, url
from dpmagic.gate.console.overview import overview_page
from dpmagic.gate.console.owners import AdminTokens, Owner, bearer
from dpmagic.gate.console.query_log import DEFAULT_ROWS, MAX_ROWS, log_page
from dpmagic.gate.console.renewals import renewals_page
from dpmagic.gate.console.sessions import Session, Sessions
from dpmagic.gate.failures import OwnerError
from dpmagic.gate.ledger.scopes import Scope, ScopeKind
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Policy, PolicyError

COOKIE = "dpmagic-console"
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
log = logging.getLogger("dpmagic.console")


class Refused(HTTPError):
    """A 403 whose reason the page may show (it says nothing of the ledger)."""

    def __init__(self, why: str) -> None:
        super().__init__(403, why)
        self.why = why


class WrongHost(HTTPError):
    """A request naming a host the console does not serve: a bare 400, no details."""

    def __init__(self) -> None:
        super().__init__(400)


def check_host(handler: RequestHandler, hosts: Hosts) -> None:
    """Refuse a request whose ``Host`` header is not one of ``hosts`` (``hosts.py``).
    The header as sent, not tornado's ``request.host``, which stands in 127.0.0.1 for
    a request that names none."""
    host = handler.request.headers.get("Host")
    if not hosts.allows(host):
        log.warning("refused a request naming host %.80r: not an address this console serves", host)
        raise WrongHost()


class Ledgers:
    """The gate's ledger, opened once it exists and kept open: a GET never creates it
    (a change does, as ``dpmagic budget grant`` does)."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._open = contextlib.ExitStack()
        self._ledger: Ledger | None = None

    def get(self, create: bool = False) -> Ledger | None:
        if self._ledger is None:
            path = self._policy.gate.state_dir / owner.LEDGER_FILE
            if not create and not path.exists():
                return None
            self._ledger = self._open.enter_context(owner.open_ledger(self._policy, create))
        return self._ledger

    def close(self) -> None:
        self._open.close()


@dataclass
class Console:
    """What every request of one console shares. Its pages are built on one thread of
    their own (``pages``), off the event loop: reading the ledger and planning the
    preview take milliseconds to seconds, and the loop keeps answering meanwhile (a
    sign-in, another owner's request); one thread, so builds never overlap."""

    policy: Policy
    base: str  # the URL path the console is served under, ending in "/"
    admins: AdminTokens | None
    unix: Owner | None  # the owner a login URL signs in (None on a Hub)
    # Public URLs it is reached at besides its own address (on a Hub, the Hub's).
    public: tuple[str, ...] = ()
    # The Hosts it answers: set once it is bound (``serve.py``); until then, none.
    hosts: Hosts = field(default_factory=Hosts)
    # On a Hub: whether the Hub has a user of that name (``hub.hub_knows``).
    hub_users: Callable[[str], bool] | None = None
    sessions: Sessions = field(default_factory=Sessions)
    read_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    ledgers: Ledgers = field(init=False)
    pages: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.ledgers = Ledgers(self.policy)
        self.pages = ThreadPoolExecutor(max_workers=1, thread_name_prefix="console-pages")

    def close(self) -> None:
        """Wait for a page being built, then close the ledger."""
        self.pages.shutdown(wait=True)
        self.ledgers.close()


class ConsoleHandler(RequestHandler):
    """Every page and action of the console, below its base URL."""

    console: Console
    # Until ``prepare`` knows better (a refusal may be written before it runs).
    who: Owner | None = None
    session: Session | None = None

    def initialize(self, console: Console) -> None:
        self.console = console

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "same-origin")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self) -> None:
        self.who, self.session = None, None
        check_host(self, self.console.hosts)
        token = bearer(self.request.headers.get("Authorization"))
        if token is not None and self.console.admins is not None:
            self.who = self.console.admins.owner(token)
            if self.who is None:
                raise Refused("that token is not one of this console's admin tokens")
        else:
            self.who, self.session = await self.signed_in()
        if self.request.method == "POST":
            self.check_xsrf_cookie()

    async def signed_in(self) -> tuple[Owner | None, Session | None]:
        """The owner and session of the request's session cookie, if it has a live one."""
        session = self.console.sessions.find(self.get_cookie(COOKIE))
        return (None, None) if session is None else (session.owner, session)

    def check_xsrf_cookie(self) -> None:
        """Refuse a POST that may have been forged (``guards.py``). Signing in has no
        session yet: its origin alone is checked. A bearer token's request carries no
        cookie a forger could ride on; an Origin it names must still be ours."""
        headers = self.request.headers
        origin_ok = same_origin(headers.get("Origin"), headers.get("Referer"), self.request.host)
        if bearer(headers.get("Authorization")) is not None and self.console.admins is not None:
            if "Origin" in headers and not origin_ok:
                raise Refused("this change came from another site")
            return
        if not origin_ok:
            raise Refused("this change came from another site's page, or names no origin")
        if self.path_kwargs["path"] == "login":
            return
        session = self.console.sessions.find(self.get_cookie(COOKIE))
        if not csrf_ok(session, self.get_body_argument(CSRF_FIELD, None)):
            raise Refused("this form is stale or was not the console's; reload the page")
        if self.who is not None and session is not None and session.owner != self.who:
            # On a Hub: the browser's console session is another admin's than its Hub's.
            raise Refused("this form was another owner's; reload the page")

    def not_signed_in(self) -> None:
        """Answer a request without an owner: the sign-in form, and nothing else."""
        raise Refused("sign in as an owner of this gate to see its console")

    # Pages (GET) and actions (POST), by their path below the console's base.

    async def get(self, path: str) -> None:
        if path == "login":
            self._login_by_link()
            return
        if self.who is None:
            self.not_signed_in()
            return
        pages: dict[str, Callable[[Frame], str]] = {
            "": self._show_overview,
            "budgets": self._show_budgets,
            "log": self._show_log,
            "renewals": self._show_renewals,
            "change": self._show_change,
        }
        if path not in pages:
            raise HTTPError(404)
        frame = self._frame()  # on the loop: it takes the session's note
        try:
            body = await IOLoop.current().run_in_executor(self.console.pages, pages[path], frame)
            self.finish(body)
        except (OwnerError, PolicyError) as exc:  # a filter or a link the owner mistyped
            self.set_status(400)
            self.finish(message("Not understood", str(exc)))

    async def post(self, path: str) -> None:
        if path == "login":
            self._login_by_form()
            return
        if self.who is None:
            self.not_signed_in()
            return
        if path == "logout":
            self.console.sessions.close(self.get_cookie(COOKIE))
            self.clear_cookie(COOKIE, path=self.console.base)
            self.redirect(self.console.base + "login", status=303)
        elif path in ("grant", "reset"):
            await self._apply(path)
        else:
            raise HTTPError(404)

    def _frame(self) -> Frame:
        assert self.who is not None
        if self.session is None:
            return Frame(self.console.base, self.who)
        note = self.console.sessions.take_note(self.get_cookie(COOKIE))
        return Frame(self.console.base, self.who, self.session.csrf, note)

    def _datasets(self) -> list[str]:
        name = self.get_query_argument("dataset", "")
        return (
            [self.console.policy.dataset(name).name]
            if name
            else sorted(self.console.policy.datasets)
        )

    def _show_overview(self, frame: Frame) -> str:
        return overview_page(frame, self.console.policy, self.console.read_at)

    def _show_budgets(self, frame: Frame) -> str:
        arg = self.get_query_argument
        selected: Scope | None = None
        if arg("budget", ""):
            selected = owner.scope_named(
                self.console.policy,
                arg("dataset", "") or None,
                arg("budget"),
                arg("holder", ""),
                arg("notebook", ""),
            )
        accuracy = None
        if arg("accuracy", ""):
            accuracy = owner.amount(arg("accuracy"))
            if not accuracy > 0:
                raise OwnerError("the accuracy must be a number above 0")
        return budgets_page(
            frame,
            self.console.policy,
            self.console.ledgers.get(),
            self._datasets(),
            selected,
            accuracy,
        )

    def _show_log(self, frame: Frame) -> str:
        arg = self.get_query_argument
        status = arg("status", "")
        if status and status not in owner.STATUSES:
            raise OwnerError(f"no such status: {status!r}")
        try:
            limit = max(1, min(MAX_ROWS, int(arg("limit", "") or DEFAULT_ROWS)))
        except ValueError:
            raise OwnerError("at most how many rows: a whole number") from None
        which = owner.LogFilter(
            user=arg("user", "") or None,
            notebook=arg("notebook", "") or None,
            status=status or None,
            text=arg("q", "") or None,
            limit=limit,
        )
        entries = owner.log(self.console.ledgers.get(), self._datasets(), which)
        return log_page(frame, self.console.policy, entries, arg("dataset", ""), which)

    def _show_renewals(self, frame: Frame) -> str:
        found = owner.renewals(self.console.policy, self.console.ledgers.get())
        return renewals_page(frame, found)

    def _users(self) -> list[str]:
        """The users the gate can list, offered as the change form's completions."""
        return sorted(listed_users(self.console.policy, self.console.ledgers.get()))

    def _show_change(self, frame: Frame) -> str:
        form = ChangeForm.read(lambda name: self.get_query_argument(name, None))
        return change_page(frame, self.console.policy, form, self._users())

    async def _apply(self, action: str) -> None:
        """A grant or reset from the change form, through ``owner`` as the CLI's: made
        at once only if it names no user the gate does not know and is not a reset;
        else once a second request confirms it (``changes.py``). Decided and written on
        the pages' thread, after any page being built."""
        assert self.who is not None
        form = ChangeForm.read(lambda name: self.get_body_argument(name, None))
        frame = self._frame()
        status, body, change = await IOLoop.current().run_in_executor(
            self.console.pages, self._decide, frame, form, action
        )
        if change is None:
            self.set_status(status)
            if frame.csrf is None:  # a script with a bearer token: one line
                self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(body)
            return
        log.info("%s by %s", change.describe(), self.who.by)
        cookie = self.get_cookie(COOKIE)
        if self.session is None or cookie is None:  # a script with a bearer token
            self.finish(change.describe() + "\n")
            return
        self.console.sessions.note(cookie, change.describe())
        self.redirect(url(self.console.base, "log", dataset=change.scope.dataset), status=303)

    def _decide(
        self, frame: Frame, form: ChangeForm, action: str
    ) -> tuple[int, str, owner.Change | None]:
        """The change made (200, with it), refused (400) or waiting for its
        confirmation (409), with the page or line that says so."""
        assert self.who is not None
        policy = self.console.policy
        try:
            change = form.change(policy, action, self.who.by)
        except (OwnerError, PolicyError) as exc:
            if frame.csrf is None:
                return 400, f"not changed: {exc}\n", None
            return 400, change_page(frame, policy, form, self._users(), str(exc)), None
        ledger = self.console.ledgers.get()
        users = (ScopeKind.USER, ScopeKind.NOTEBOOK)  # a group's holder is the policy's
        holder = change.scope.holder if change.scope.kind in users else ""
        where = known_where(policy, ledger, holder, self.console.hub_users) if holder else None
        standing = None
        if action == "reset" and ledger is not None:
            dataset = change.scope.dataset
            found = owner.standings(policy, ledger, [dataset], None)
            standing = next((s for s in found if s.scope == change.scope), None)
        close = near(policy, ledger, holder) if holder else []
        asked = sources(policy, self.console.hub_users)
        ask = needs(form, change, where, close, standing_text(standing), asked)
        if ask is not None:
            if frame.csrf is None:
                return 409, ask.line() + "\n", None
            return 409, change_page(frame, policy, form, self._users(), confirm=ask), None
        written = self.console.ledgers.get(create=True)
        assert written is not None
        owner.apply(written, change)
        return 200, "", change

    # Signing in.

    def _login_by_link(self) -> None:
        """The printed login URL: its one-time token for a session, then the overview."""
        token = self.get_query_argument("token", "")
        if not token:
            self.finish(self._sign_in_page())
            return
        if self.console.unix is None or not self.console.sessions.redeem(token):
            self.set_status(403)
            self.finish(self._sign_in_page("this login link was used already, or is not valid"))
            return
        self._open_session(self.console.unix)

    def _login_by_form(self) -> None:
        """The sign-in form: the login URL's token, or an admin token."""
        token = self.get_body_argument("token", "").strip()
        found: Owner | None = None
        if self.console.unix is not None and token and self.console.sessions.redeem(token):
            found = self.console.unix
        elif self.console.admins is not None and token:
            found = self.console.admins.owner(token)
        if found is None:
            self.set_status(403)
            self.finish(self._sign_in_page("that token does not sign anyone in here"))
            return
        self._open_session(found)

    def _open_session(self, who: Owner) -> None:
        self.console.sessions.close(self.get_cookie(COOKIE))
        cookie, self.session = self.console.sessions.open(who)
        self.set_session_cookie(cookie)
        log.info("%s signed in", who.by)
        self.redirect(self.console.base, status=303)

    def set_session_cookie(self, cookie: str) -> None:
        self.set_cookie(
            COOKIE,
            cookie,
            path=self.console.base,
            httponly=True,
            samesite="Strict",
            secure=self.request.protocol == "https",
        )

    def _sign_in_page(self, problem: str | None = None) -> str:
        """The sign-in form, where a token can sign anyone in (not on a Hub without
        admin tokens: there the Hub signs its admins in)."""
        return render(
            "sign_in.html",
            title="Sign in",
            base=self.console.base,
            problem=problem,
            unix=self.console.unix is not None,
            admins=self.console.admins is not None,
        )

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """A refusal or an error as a page: its reason where it is one a user may read
        (a refusal's, an owner's mistake), else the status alone, never a traceback."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, WrongHost):
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish("400 Bad Request\n")
            return
        if isinstance(exc, Refused):
            self.finish(
                self._sign_in_page(exc.why) if self.who is None else message("Refused", exc.why)
            )
            return
        reason = "no such page" if status_code == 404 else ""
        self.finish(message(str(status_code), reason))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, HTTPError):
            log.info("%s %s: %s", self.request.method, self.request.path, value.status_code)
        else:
            super().log_exception(typ, value, tb)


def _log_request(handler: RequestHandler) -> None:
    """The access log: method, path and status; never a query string (the login
    token, filters) nor a form."""
    request = handler.request
    log.info("%d %s %s", handler.get_status(), request.method, request.path)


def application(
    console: Console, handler: type[ConsoleHandler] = ConsoleHandler, extra: list[Any] | None = None
) -> Application:
    routes = [*(extra or []), (console.base + "(?P<path>.*)", handler, {"console": console})]
    return Application(
        routes,
        cookie_secret=secrets.token_bytes(32),
        log_function=_log_request,
        xsrf_cookies=False,  # the console's own check, for every POST (``guards.py``)
    )
