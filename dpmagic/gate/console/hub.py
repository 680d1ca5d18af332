"""The console as a JupyterHub service: the Hub's admins sign in with the Hub's OAuth.

The Hub starts ``dpmagic console --jupyterhub`` as a service with a URL, proxies
``/services/NAME/`` to it, and lists it in its Services menu. A browser there is sent
to the Hub to sign in (OAuth, jupyterhub's ``HubOAuth``), and comes back with a token
of the Hub's in a cookie; on each request the console asks the Hub (answers kept
``CACHE_S``) who the token is, and admits them only if:

- the token is a user's, not a service's;
- the Hub says that user is one of its admins (the user model's ``admin``: set by
  ``Authenticator.admin_users`` or the Hub's ``admin`` role), read from the Hub on
  every check, so an admin demoted there is refused within ``CACHE_S``;
- the token carries access to this service (``access:services!service=NAME``): a
  token an admin made for something else, with fewer scopes, does not open the
  console just because its owner is an admin.

Why the ``admin`` flag and not the ``admin:users`` scope: for the console to see that
scope, the Hub would have to put it into the tokens it hands the console (the
service's ``oauth_client_allowed_scopes``), and every console cookie would then carry
the power to administer the Hub's users. With the flag, the console's tokens can do
nothing but identify their admin to it. A role granting ``access:services`` to other
users lets them reach the console's URL, never past this check.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from functools import partial
from typing import Any
from urllib.parse import quote, urlsplit

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from tornado.web import Application

from dpmagic.gate.console.owners import AdminTokens, Owner, Way
from dpmagic.gate.console.server import (
    COOKIE,
    Console,
    ConsoleHandler,
    Refused,
    application,
    check_host,
)
from dpmagic.gate.console.sessions import Session
from dpmagic.gate.failures import OwnerError
from dpmagic.gate.policy import Policy

# How long the Hub's word on a token is kept: a demoted admin is refused within it.
CACHE_S = 60
# How long the console waits for the Hub's word on whether it has a user.
HUB_ASK_S = 5


def hub_admin(model: dict[str, Any], hub_auth: HubOAuth) -> Owner:
    """The console's owner a Hub user model names, or ``Refused`` (see the module)."""
    name = str(model.get("name", ""))
    if model.get("kind", "user") != "user":
        raise Refused(f"{name} is a Hub service: the console is for the Hub's admins")
    if model.get("admin") is not True:
        raise Refused(f"{name} is not an admin of this Hub: the console is for its admins")
    if not hub_auth.check_scopes(hub_auth.access_scopes, model):
        raise Refused("this token has no access to the console; sign in through the Hub")
    return Owner(name, Way.HUB)


class HubConsoleHandler(HubOAuthenticated, ConsoleHandler):
    """The console's handler, its owners signed in by the Hub."""

    # The console's own CSRF check, not the Hub's: HubOAuth calls this before it
    # trusts its cookie on a POST.
    check_xsrf_cookie = ConsoleHandler.check_xsrf_cookie

    async def signed_in(self) -> tuple[Owner | None, Session | None]:
        model = await self.hub_auth.get_user(self, sync=False)
        if not model:
            return None, None
        who = hub_admin(model, self.hub_auth)
        sessions = self.console.sessions
        session = sessions.find(self.get_cookie(COOKIE))
        if (session is None or session.owner != who) and self.request.method == "GET":
            # The admin's console session, which holds the CSRF token of their forms.
            cookie, session = sessions.open(who)
            self.set_session_cookie(cookie)
        return who, (session if session is not None and session.owner == who else None)

    def not_signed_in(self) -> None:
        """A browser nobody signed in yet goes to the Hub to sign in; a POST is refused."""
        if self.request.method == "GET":
            self.redirect(self.get_login_url())
            return
        super().not_signed_in()


class HubCallbackHandler(HubOAuthCallbackHandler):
    """The Hub's OAuth callback, which sets the Hub's cookie: at the console's own
    addresses only, as every page (``hosts.py``)."""

    def initialize(self, console: Console) -> None:
        self.console = console

    def prepare(self) -> None:
        check_host(self, self.console.hosts)
        super().prepare()


def hub_knows(hub_auth: HubOAuth, name: str) -> bool:
    """Whether the Hub has a user ``name`` (``known.py``: a grant to a user nobody knows
    is asked about first). Asked of the Hub's API with the console's own service token,
    which needs the ``read:users:name`` scope (docs/console.md); without it, or when
    the Hub does not answer, the user counts as unknown and the owner is asked."""
    request = urllib.request.Request(
        f"{hub_auth.api_url.rstrip('/')}/users/{quote(name, safe='')}",
        headers={"Authorization": f"token {hub_auth.api_token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=HUB_ASK_S) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def hub_public_urls() -> tuple[str, ...]:
    """The public URLs the Hub gives its services (``c.JupyterHub.public_url``, or the
    service's own ``host``): the browser's ``Host`` behind the Hub's proxy."""
    names = ("JUPYTERHUB_PUBLIC_URL", "JUPYTERHUB_PUBLIC_HUB_URL", "JUPYTERHUB_HOST")
    return tuple(dict.fromkeys(v for n in names if (v := os.environ.get(n, "").strip())))


def hub_console(
    policy: Policy, admins: AdminTokens | None
) -> tuple[Console, Application, str, int]:
    """The console, its application, and the address the Hub proxies it from
    (``$JUPYTERHUB_SERVICE_URL``), under the service's prefix."""
    service_url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "")
    if not service_url or not prefix:
        raise OwnerError(
            "--jupyterhub runs the console as a Hub service: add it to "
            "c.JupyterHub.services with a url (docs/console.md)"
        )
    where = urlsplit(service_url)
    base = prefix if prefix.endswith("/") else prefix + "/"
    hub_auth = HubOAuth.instance(cache_max_age=CACHE_S)  # every handler's and the callback's
    console = Console(policy, base, admins, unix=None, public=hub_public_urls())
    console.hub_users = partial(hub_knows, hub_auth)
    callback = (base + "oauth_callback", HubCallbackHandler, {"console": console})
    app = application(console, HubConsoleHandler, [callback])
    return console, app, where.hostname or "127.0.0.1", where.port or 80
