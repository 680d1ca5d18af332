"""The owner's console in a real browser: ``dpmagic console`` driven by Chromium through
Playwright, as an owner uses it.

Signed in by the printed login URL: the overview, the budgets with their charts, the
query log filtered, a grant made with a reason and seen in the log. The change form,
with scripts off: each kind of budget's fields and only those sent, a misspelt user
asked about before it is created, a reset asked about before it is made. A second browser
profile that never signed in is refused, and so is the printed URL a second time; a
page of another site whose form posts a grant to the console gets a 403 and writes
nothing. Screenshots are kept in ``test-artifacts/console-*.png``.

Run with ``python -m pytest -m browser``. It needs Debian's ``chromium`` and
Playwright's Python client; Playwright's own browser download is never used.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dpmagic.gate import owner
from dpmagic.gate.policy import Policy
from tests.chromium import ARTIFACTS, CHROMIUM, FLAGS, playwright_api
from tests.consoles import ConsoleProcess, console_policy, console_process, seed

pytestmark = pytest.mark.browser
sync_api = playwright_api()
STEP_MS = 20_000


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    found = console_policy(tmp_path)
    seed(found)
    return found


@pytest.fixture
def console(policy: Policy) -> Iterator[ConsoleProcess]:
    with console_process(policy.path) as running:
        yield running


@pytest.fixture
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


def _history(policy: Policy) -> list[dict[str, object]]:
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        return ledger.history()


def test_an_owner_signs_in_reads_budgets_filters_the_log_and_grants(
    console: ConsoleProcess, browser, policy: Policy
) -> None:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(STEP_MS)
    page.goto(console.login)
    assert page.url == console.base  # the token is gone from the address bar
    assert page.locator("h1").inner_text() == "Overview"
    assert page.locator("header .who").inner_text() == f"signed in as {owner.operator()}"
    _shoot(page, "console-overview.png")

    page.get_by_role("link", name="Budgets").click()
    assert page.locator("svg.chart").count() == 1  # the dataset's
    row = page.locator("tr", has=page.locator("td", has_text="alice")).filter(
        has_text="(all notebooks)"
    )
    assert row.locator("td").nth(3).inner_text() == "0.75"
    row.get_by_role("link", name="chart").click()
    assert page.locator("svg.chart").count() == 2
    assert "Spending of the budget of user alice" in page.locator("h2").first.inner_text()
    _shoot(page, "console-budgets.png")

    page.get_by_role("link", name="Query log").click()
    page.fill("input[name=user]", "alice")
    page.select_option("select[name=status]", "released")
    page.get_by_role("button", name="Filter").click()
    users = page.locator("tbody tr td:nth-child(3)").all_inner_texts()
    assert users == ["alice", "alice"]
    assert set(page.locator("tbody tr .status").all_inner_texts()) == {"released"}
    _shoot(page, "console-log-filtered.png")

    # A query the gate refused before its debit, as the engine records it.
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        ledger.record_refusal(
            user="bob", dataset="d", notebook="hw1.ipynb", sql="SELECT * FROM t",
            reason="only aggregates are released: SELECT * would show rows",
        )  # fmt: skip
    page.fill("input[name=user]", "")
    page.select_option("select[name=status]", "refused")
    page.get_by_role("button", name="Filter").click()
    [refused] = page.locator("tbody tr").all()
    assert refused.locator(".status").inner_text() == "refused"
    assert refused.locator(".reason").inner_text() == (
        "refused: only aggregates are released: SELECT * would show rows"
    )
    _shoot(page, "console-log-refused.png")

    before = len(_history(policy))
    page.get_by_role("link", name="Change a budget").click()
    page.locator("nav.kinds a[href*='budget=user']").click()
    page.fill("input[name=holder]", "bob")
    page.fill("input[name=epsilon]", "0.75")
    page.fill("textarea[name=reason]", "exam week: one more analysis")
    page.get_by_role("button", name="Grant").click()
    assert page.locator(".flash").inner_text() == (
        "granted ε=0.75 to the budget of user bob on dataset 'd'"
    )
    first = page.locator("tbody tr").first
    assert first.locator(".status").inner_text() == "granted"
    assert f"budget grant by {owner.operator()}: exam week: one more analysis" in (
        first.inner_text()
    )
    _shoot(page, "console-grant.png")
    assert len(_history(policy)) == before + 1

    # Another browser, never signed in, sees nothing; the printed URL is spent.
    stranger = browser.new_context(viewport={"width": 1280, "height": 500}).new_page()
    stranger.set_default_timeout(STEP_MS)
    reply = stranger.goto(console.base + "budgets")
    assert reply is not None and reply.status == 403
    assert "alice" not in stranger.content() and "ε" not in stranger.content()
    reply = stranger.goto(console.login)
    assert reply is not None and reply.status == 403
    assert "used already" in stranger.content()
    _shoot(stranger, "console-refused.png")


@pytest.fixture
def other_site(console: ConsoleProcess) -> Iterator[str]:
    """A page of another site (``localhost``, not the console's ``127.0.0.1``) whose form
    posts a grant to the console, as a forger would make it: every field but the
    session's CSRF token, which it cannot read."""
    fields = {"dataset": "d", "budget": "user", "holder": "mallory", "epsilon": "100",
              "reason": "forged", "_csrf": "guessed"}  # fmt: skip
    inputs = "".join(
        f'<input type="hidden" name="{k}" value="{html.escape(v)}">' for k, v in fields.items()
    )
    body = (
        f'<!doctype html><form method="post" action="{console.base}grant">{inputs}'
        "<button>Win a prize</button></form>"
    ).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_another_sites_form_cannot_change_a_budget(
    console: ConsoleProcess, browser, policy: Policy, other_site: str
) -> None:
    page = browser.new_context().new_page()
    page.set_default_timeout(STEP_MS)
    page.goto(console.login)  # the owner is signed in, in this browser
    before = _history(policy)
    page.goto(other_site)
    with page.expect_navigation() as navigation:
        page.get_by_role("button", name="Win a prize").click()
    assert navigation.value is not None and navigation.value.status == 403
    assert _history(policy) == before
    page.goto(console.base + "log")  # still signed in, and nothing was granted
    assert "mallory" not in page.content()


KINDS = [
    ("user", ["holder"]),
    ("notebook", ["holder", "notebook"]),
    ("group", ["holder"]),
    ("dataset", []),
]


def test_the_change_form_follows_the_kind_and_asks_before_a_slip(
    console: ConsoleProcess, browser, policy: Policy
) -> None:
    """As a TA uses it, in a browser with JavaScript off (the pages carry none)."""
    context = browser.new_context(
        viewport={"width": 1100, "height": 760}, java_script_enabled=False
    )
    page = context.new_page()
    page.set_default_timeout(STEP_MS)
    page.goto(console.login)
    page.get_by_role("link", name="Change a budget").click()
    assert page.locator("form.change").count() == 0  # the kind first
    _shoot(page, "console-change-choose.png")

    for kind, naming in KINDS:
        page.locator(f"nav.kinds a[href*='budget={kind}']").click()
        assert page.locator("nav.kinds a.on").get_attribute("href").endswith(f"budget={kind}")
        names = [n.get_attribute("name") for n in page.locator("form.change [name]").all()]
        assert names == ["_csrf", "budget", "dataset", *naming, "epsilon", "delta", "reason"]
        _shoot(page, f"console-change-{kind}.png")

    # A notebook's grant sends its notebook; a user's, which has no such field, none.
    page.locator("nav.kinds a[href*='budget=user']").click()
    page.fill("input[name=holder]", "alcie")  # alice, misspelt
    page.fill("input[name=epsilon]", "0.5")
    page.fill("textarea[name=reason]", "lab 3 retake")
    before = _history(policy)
    with page.expect_request("**/grant") as sent:
        page.get_by_role("button", name="Grant").click()
    assert "notebook=" not in (sent.value.post_data or "")
    confirm = page.locator("section.confirm")
    assert "No user alcie is known to this gate (it looked in the policy's groups, the ledger)" in (
        confirm.inner_text()
    )
    assert "Did you mean alice?" in confirm.inner_text()
    _shoot(page, "console-change-unknown-user.png")
    assert _history(policy) == before
    # The name is fixed in the form below, and granted at once: alice is known.
    page.fill("form.change input[name=holder]", "alice")
    page.locator("form.change").get_by_role("button", name="Grant").click()
    assert page.locator(".flash").inner_text() == (
        "granted ε=0.5 to the budget of user alice on dataset 'd'"
    )
    assert len(_history(policy)) == len(before) + 1

    # A reset: its button apart, and a confirmation naming the budget first.
    page.get_by_role("link", name="Change a budget").click()
    page.locator("nav.kinds a[href*='budget=user']").click()
    page.fill("input[name=holder]", "bob")
    page.fill("textarea[name=reason]", "new term")
    page.get_by_role("button", name="Reset…").click()
    confirm = page.locator("section.confirm")
    assert "Confirm the reset" in confirm.inner_text()
    assert "the budget of user bob on dataset 'd'" in confirm.inner_text()
    _shoot(page, "console-change-reset-confirm.png")
    assert len(_history(policy)) == len(before) + 1
    confirm.get_by_role("link", name="Cancel").click()
    assert page.locator("section.confirm").count() == 0
    assert page.locator("input[name=holder]").input_value() == "bob"
    assert len(_history(policy)) == len(before) + 1
    page.get_by_role("button", name="Reset…").click()
    page.get_by_role("button", name="Reset the budget of user bob on dataset 'd'").click()
    assert page.locator(".flash").inner_text() == "reset the budget of user bob on dataset 'd'"
    assert _history(policy)[0]["status"] == "reset"
