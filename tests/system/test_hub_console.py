"""The owner's console as a JupyterHub service, in a real Hub and a real Chromium.

The Hub (tests/hubs.py) starts ``dpmagic console --jupyterhub`` as a service with
the ``c.JupyterHub.services`` entry docs/console.md gives. The Hub's admin signs in
at the Hub, opens the console from the Hub's Services menu, is signed in to it by the
Hub's OAuth and makes a grant; a user who is not an admin, though a role lets them
reach the service's URL, is refused by the console itself; a browser nobody signed
in is sent to the Hub's login. Screenshots in ``test-artifacts/console-hub-*.png``.

Run with ``python -m pytest -m hub`` (needs the hub extra, ``configurable-http-proxy``
in ``.hub/``, Debian's ``chromium`` and Playwright's Python client).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from dpmagic.gate import owner
from dpmagic.gate.policy import Policy
from tests.chromium import ARTIFACTS, CHROMIUM, FLAGS, playwright_api
from tests.conftest import free_port
from tests.consoles import PLANTED, console_policy, seed
from tests.hubs import START_TIMEOUT_S, Hub, needs_hub, running_hub, wait_for

pytestmark = pytest.mark.hub
sync_api = playwright_api()
STEP_MS = 60_000
SERVICE = "dpmagic-console"
ADMIN, USER = "ada", "bob"

# docs/console.md's service entry; and a role that lets every user reach the console's
# URL, so that it is the console's own rule that refuses a user who is not an admin.
SERVICES = """
c.Authenticator.admin_users = {{"{admin}"}}
c.JupyterHub.services = [
    {{
        "name": "{service}",
        "url": "http://127.0.0.1:{port}",
        "command": [{python!r}, "-m", "dpmagic", "console", "--jupyterhub", "--policy", {policy!r}],
        "oauth_no_confirm": True,
    }},
]
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service={service}"]}},
]
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hub, Policy]]:
    needs_hub()
    work = tmp_path_factory.mktemp("hub-console")
    (work / "data").mkdir()
    policy = console_policy(work / "data")
    seed(policy)
    port = free_port()
    services = SERVICES.format(
        admin=ADMIN, service=SERVICE, port=port, python=sys.executable, policy=str(policy.path)
    )
    with running_hub(work, {ADMIN, USER}, services) as running:
        deadline = time.monotonic() + START_TIMEOUT_S
        wait_for(f"http://127.0.0.1:{port}/services/{SERVICE}/", deadline, "the console", running)
        for path in ("/hub/login", f"/services/{SERVICE}/login"):
            wait_for(running.proxy + path, deadline, "the proxy", running, served=True)
        yield running, policy


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _sign_in(browser, hub: Hub, user: str, then: str):
    """A fresh browser profile signed in to the Hub as ``user`` (the dummy authenticator
    takes any password), at ``then``."""
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.set_default_timeout(STEP_MS)
    reply = page.goto(f"{hub.proxy}/hub/login?next={then}")
    assert reply is not None and reply.status == 200, hub.tail()
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", "any password")
    page.click("input[type=submit], button[type=submit]")
    return page


def test_the_hubs_admin_opens_the_console_from_the_hub_and_grants(
    hub: tuple[Hub, Policy], browser
) -> None:
    running, policy = hub
    page = _sign_in(browser, running, ADMIN, "/hub/home")
    page.wait_for_url("**/hub/home")
    page.get_by_role("button", name="Services").or_(
        page.get_by_role("link", name="Services")
    ).click()
    entry = page.get_by_role("link", name=SERVICE)
    assert entry.get_attribute("href") == f"/services/{SERVICE}/"
    _shoot(page, "console-hub-services.png")
    entry.click()
    page.wait_for_url(f"**/services/{SERVICE}/")
    assert page.locator("h1").inner_text() == "Overview"
    assert page.locator("header .who").inner_text() == f"signed in as hub:{ADMIN}"
    _shoot(page, "console-hub-admin.png")

    page.get_by_role("link", name="Change a budget").click()
    page.locator("nav.kinds a[href*='budget=user']").click()
    page.fill("input[name=holder]", "alice")
    page.fill("input[name=epsilon]", "0.5")
    page.fill("textarea[name=reason]", "resubmission allowed")
    page.get_by_role("button", name="Grant").click()
    assert page.locator(".flash").inner_text() == (
        "granted ε=0.5 to the budget of user alice on dataset 'd'"
    )
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        assert ledger.history(limit=1)[0]["sql"] == (
            f"budget grant by hub:{ADMIN}: resubmission allowed"
        )
    page.get_by_role("link", name="Budgets").click()
    assert page.locator("svg.chart").count() == 1
    for value in PLANTED:
        assert value not in page.content()


def test_a_hub_user_who_is_not_an_admin_is_refused(hub: tuple[Hub, Policy], browser) -> None:
    running, _ = hub
    page = _sign_in(browser, running, USER, f"/services/{SERVICE}/budgets")
    page.wait_for_url(f"**/services/{SERVICE}/budgets")
    reply = page.reload()
    assert reply is not None and reply.status == 403
    text = page.locator("body").inner_text()
    assert f"{USER} is not an admin of this Hub" in text
    for secret in ("alice", "hw1.ipynb", "SELECT", "ε="):
        assert secret not in page.content()
    _shoot(page, "console-hub-refused.png")


def test_a_browser_nobody_signed_in_is_sent_to_the_hubs_login(
    hub: tuple[Hub, Policy], browser
) -> None:
    running, _ = hub
    page = browser.new_context().new_page()
    page.set_default_timeout(STEP_MS)
    page.goto(f"{running.proxy}/services/{SERVICE}/log")
    assert "/hub/login" in page.url
    assert "SELECT" not in page.content()
