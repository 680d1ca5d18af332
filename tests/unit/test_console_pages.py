"""What the owner's console shows and does, read from its pages over real HTTP: the
numbers ``owner`` gives the CLI, the log's filters, never a released value, every
user-chosen text escaped, and changes that are the CLI's own rows in the log."""

from __future__ import annotations

import html
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from tornado.platform.asyncio import BaseAsyncIOLoop

from dpmagic.gate import owner
from dpmagic.gate.console import server as console_server
from dpmagic.gate.console.changes import ChangeForm
from dpmagic.gate.console.owners import Owner, Way
from dpmagic.gate.console.server import Console
from dpmagic.gate.ledger.scopes import Scope
from dpmagic.gate.policy import Budget, Policy
from tests.admin_cli import cli
from tests.consoles import PLANTED, QUERIES, Client, console_policy, seed, served


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    found = console_policy(tmp_path)
    seed(found)
    return found


@pytest.fixture
def console(policy: Policy) -> Console:
    return Console(policy, "/", None, Owner(owner.operator(), Way.UNIX))


@pytest.fixture
def client(console: Console) -> Iterator[Client]:
    with served(console) as base:
        client = Client(base)
        assert client.get(f"login?token={console.sessions.login_token()}").status == 303
        yield client


def cells(page: str, first_head: str) -> list[list[str]]:
    """The text of each body row's cells in the table whose first heading is given."""
    start = page.index(f"<thead><tr><th>{first_head}</th>")
    body = page[start : page.index("</table>", start)]
    return [
        [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
        for r in re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>", 1)[1])
    ]


def test_the_budgets_page_shows_the_numbers_budget_rows_gives(
    client: Client, policy: Policy
) -> None:
    with owner.open_ledger(policy) as ledger:
        rows = owner.budget_rows(policy, ledger, ["d"], None)
    shown = {(r[0], r[1], r[2]): r for r in cells(client.get("budgets").body, "budget")}
    assert len(shown) == len(rows) == 9  # the dataset, group ta, 3 users, 4 notebooks
    for row in rows:
        holder = row["group"] or row["user"]
        mine = shown[(row["budget"], holder, row["notebook"])]
        spent, limit, left = (float(x) for x in mine[3:6])
        assert spent == pytest.approx(row["spent_epsilon"], rel=1e-5)
        assert limit == pytest.approx(row["limit_epsilon"], rel=1e-5)
        assert left == pytest.approx(row["remaining_epsilon"], rel=1e-5)
        assert mine[7] == row["renews"]


def test_the_budgets_page_charts_each_dataset_and_the_chosen_budget(client: Client) -> None:
    page = client.get("budgets?dataset=d&budget=user&holder=alice").body
    charts = re.findall(r'<svg class="chart"[^>]*aria-label="([^"]*)"', page)
    assert charts == [
        "the budget of user alice on dataset &#x27;d&#x27;: spent ε=0.75 of 5",
        "d: all users&#x27; spending under the dataset budget: spent ε=1.875 of 20",
    ]
    # One step per charge, then now: 0.5, 0.75 (alice's two queries), 0.75.
    alice = page.split('<svg class="chart"')[1]
    spent = re.findall(r"spent ε=([0-9.]+) of 5</title></circle>", alice)
    assert spent == ["0.5", "0.75", "0.75"]
    group = client.get("budgets?dataset=d&budget=group&holder=ta").body
    assert "the budget of group &#x27;ta&#x27; on dataset &#x27;d&#x27;: spent ε=1.75 of 8" in group
    assert client.get("budgets?dataset=d&budget=group&holder=nope").status == 400


def test_spending_over_time_follows_grants_resets_and_the_standing(policy: Policy) -> None:
    alice = Scope.user("d", "alice")
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        owner.apply(ledger, owner.grant(alice, Budget(2.0), "root", "more"))
        owner.apply(ledger, owner.reset(alice, "root", "new term"))
        points = owner.spending(policy, ledger, alice)
        [standing] = [
            s for s in owner.standings(policy, ledger, ["d"], "alice") if s.scope == alice
        ]
    assert [(p.spent, p.limit) for p in points] == [
        (0.5, 5.0), (0.75, 5.0), (0.75, 7.0), (0.0, 5.0), (0.0, 5.0)
    ]  # fmt: skip
    assert points[-1].spent == standing.spent.epsilon
    assert points[-1].limit == standing.limit.epsilon


def logged(client: Client, query: str) -> list[list[str]]:
    page = client.get(f"log?{query}")
    assert page.status == 200, page.body
    return cells(page.body, "id") if "<thead><tr><th>id</th>" in page.body else []


def test_the_log_filters_by_user_notebook_status_text_dataset_and_count(client: Client) -> None:
    everything = logged(client, "")
    assert len(everything) == 4 + 3  # the queries, and each user's first week's row
    assert {r[2] for r in logged(client, "user=alice")} == {"alice"}
    assert {r[4] for r in logged(client, "notebook=hw1.ipynb")} == {"hw1.ipynb"}
    assert len(logged(client, "notebook=hw1.ipynb")) == 2
    # The first charge under a renewing budget opens its first period: said so.
    assert {r[5] for r in logged(client, "status=renews")} == {"period begins"}
    [bob] = logged(client, "q=group+by")  # whatever the case
    assert bob[2] == "bob" and bob[8] == QUERIES[2][3]
    assert len(logged(client, "dataset=d&limit=2")) == 2
    assert logged(client, "user=nobody") == []
    assert client.get("log?status=stolen").status == 400
    assert client.get("log?dataset=nope").status == 400
    ids = [int(r[0]) for r in everything]
    assert ids == sorted(ids, reverse=True)


def test_no_page_shows_a_released_value(client: Client, policy: Policy) -> None:
    paths = ["", "budgets", "log", "renewals", "change", "log?status=released&limit=1000"]
    with owner.open_ledger(policy) as ledger:
        for s in owner.standings(policy, ledger, ["d"], None):
            paths.append(f"budgets?{urlencode(s.scope.named().json())}")
    for path in paths:
        reply = client.get(path)
        assert reply.status == 200, (path, reply.body)
        for value in PLANTED:
            assert value not in reply.body, (path, value)


def test_user_chosen_text_is_escaped(client: Client) -> None:
    for path in ("log", "budgets"):
        page = client.get(path).body
        assert "&lt;b&gt;notes&lt;/b&gt;.ipynb" in page
        assert "<b>notes</b>" not in page


def test_a_refusal_is_listed_with_its_reason_escaped(client: Client, policy: Policy) -> None:
    """A query refused before the debit: status refused, ε 0, its SQL and the reason
    its user was told, both as text; found by a word of the reason."""
    with owner.open_ledger(policy) as ledger:
        ledger.record_refusal(
            user="bob", dataset="d", notebook="hw1.ipynb", sql="SELECT <i>x</i> FROM t",
            reason="column <b>x</b> is not declared",
        )  # fmt: skip
    [row] = logged(client, "status=refused")
    assert row[2] == "bob" and row[5] == "refused" and float(row[6]) == 0
    assert row[8] == "SELECT <i>x</i> FROM trefused: column <b>x</b> is not declared"
    page = client.get("log?status=refused").body
    assert "<b>x</b>" not in page and "<i>x</i>" not in page
    assert [r[0] for r in logged(client, "q=NOT+DECLARED")] == [row[0]]


def _sign_in_page_waits(client: Client, monkeypatch: pytest.MonkeyPatch) -> float:
    """How long the sign-in page takes while a budgets page takes 1.5 s to build."""
    started = threading.Event()

    def slow(*args: object) -> str:
        started.set()
        time.sleep(1.5)
        return "built"

    monkeypatch.setattr(console_server, "budgets_page", slow)
    slow_page = threading.Thread(target=client.get, args=("budgets",))
    slow_page.start()
    assert started.wait(10)
    begun = time.perf_counter()
    assert Client(client.base).get("login").status == 200
    waited = time.perf_counter() - begun
    slow_page.join(10)
    return waited


def test_a_page_being_built_does_not_hold_up_the_console(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages are built off the event loop (reading the ledger, planning the preview):
    a sign-in is answered while a slow page is being built; built on the loop (the
    broken version, the search below), it waits for it."""
    assert _sign_in_page_waits(client, monkeypatch) < 0.75


@pytest.mark.search  # a page built for 1.5 s on the loop: with the searches
def test_a_page_built_on_the_loop_is_caught(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken version of the test above: a sign-in waits for the page."""

    async def on_the_loop(self: object, executor: object, build: Any, *args: object) -> object:
        return build(*args)

    monkeypatch.setattr(BaseAsyncIOLoop, "run_in_executor", on_the_loop)
    assert _sign_in_page_waits(client, monkeypatch) > 1.0


CHANGES = [
    (["--user", "alice"], {"budget": "user", "holder": "alice"}),
    (["--user", "alice", "--notebook", "hw1.ipynb"],
     {"budget": "notebook", "holder": "alice", "notebook": "hw1.ipynb"}),
    (["--group", "ta"], {"budget": "group", "holder": "ta"}),
    (["--all-users"], {"budget": "dataset"}),
]  # fmt: skip


@pytest.mark.parametrize(("options", "fields"), CHANGES)
def test_a_console_change_is_the_clis_own_row_in_the_log(
    client: Client,
    policy: Policy,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    fields: dict[str, str],
) -> None:
    """Owner actions have one implementation: the same grant and reset through the
    console and through ``dpmagic budget`` write the same rows, but for id and time."""
    where = ["--policy", str(policy.path), "--dataset", "d", *options]
    for action, amount in (("grant", {"epsilon": "0.5", "delta": ""}), ("reset", {})):
        form = {"dataset": "d", **fields, **amount, "reason": f"{action}: lab 3  retake"}
        if action == "reset":
            form["confirm"] = "reset"  # the confirmation step's
        reply = client.post(action, {**form, "_csrf": client.csrf()})
        assert reply.status == 303, reply.body
        flags = ["--epsilon", "0.5"] if amount else []
        code, out, _ = cli(capsys, "budget", action, *where, *flags, "--reason", form["reason"])
        assert code == 0, out
        # The console's note of what was done is the CLI's.
        assert html.escape(out.strip()) in client.get("log").body
        with owner.open_ledger(policy) as ledger:
            assert ledger is not None
            ours, theirs = ledger.history(limit=2)[::-1]
        assert {**ours, "id": 0, "time": ""} == {**theirs, "id": 0, "time": ""}
        assert ours["sql"] == f"budget {action} by {owner.operator()}: {action}: lab 3 retake"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reason": "  "}, "say why (a reason), for the audit log"),
        ({"holder": "zed", "budget": "group"}, "group &#x27;zed&#x27; has no budget"),
        ({"epsilon": "-1"}, "must be a finite number ≥ 0"),
        ({"epsilon": "0"}, "a grant needs an ε or a δ above 0"),
        ({"budget": "notebook"}, "name the notebook whose budget changes"),
        ({"dataset": "nope"}, "unknown dataset"),
        ({"budget": ""}, "choose which budget"),
        ({"budget": "users"}, "no such budget"),
        ({"notebook": "hw1.ipynb"}, "a user&#x27;s budget has no notebook, and &#x27;hw1.ipynb"),
        ({"budget": "group", "holder": "ta", "notebook": "hw1.ipynb"}, "has no notebook"),
        ({"budget": "dataset", "holder": "alice"}, "names nobody, and &#x27;alice&#x27; was given"),
    ],
)
def test_a_bad_change_is_explained_and_writes_nothing(
    client: Client, policy: Policy, fields: dict[str, str], message: str
) -> None:
    form = {"dataset": "d", "budget": "user", "holder": "alice", "epsilon": "1",
            "reason": "why", **fields}  # fmt: skip
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        before = len(ledger.history())
        reply = client.post("grant", {**form, "_csrf": client.csrf()})
        assert reply.status == 400
        assert message in reply.body
        assert len(ledger.history()) == before


def test_the_renewals_page_shows_each_renewing_budget_and_its_rows(client: Client) -> None:
    page = client.get("renewals").body
    [summary] = cells(page, "dataset")
    assert summary[:5] == ["d", "each user", "5", "0", "week"]
    assert summary[5].startswith("week ") and summary[7] == "3"
    rows = cells(page, "id")
    assert {r[3] for r in rows} == {"alice", "bob", "carol"}
    assert {r[2] for r in rows} == {"period begins"}


def test_the_overview_shows_the_policy_in_force(client: Client) -> None:
    page = client.get("").body
    budgets = {r[0]: r[1:] for r in cells(page, "budget")}
    assert budgets["each user"] == ["5", "0", "week"]
    assert budgets["group ta (alice, bob)"] == ["8", "0", "never"]
    assert budgets["the dataset (all users together)"] == ["20", "0", "never"]
    assert cells(page, "group") == [["ta", "alice, bob"]]


def test_the_budgets_page_previews_what_the_dataset_budget_left_allows(
    client: Client, policy: Policy
) -> None:
    """The owner sees the utility preview users get, counted against the dataset's own
    budget as it stands: the same plans, the same fits."""
    with owner.open_ledger(policy) as ledger:
        expected = owner.preview(policy, ledger, "d", accuracy=5.0)
    assert expected["against"] == "dataset"
    page = client.get("budgets?dataset=d&accuracy=5").body
    shown = cells(page, "query")
    wanted = []
    for kind in expected["kinds"]:
        for key in ("at_accuracy", "at_default"):
            option = kind[key]
            if "refused" not in option:
                wanted.append((option["cost"]["epsilon"], option["fits"]))
    got = [(float(r[2]), int(r[4])) for r in shown]
    assert got == [(pytest.approx(cost, rel=1e-5), fits) for cost, fits in wanted]
    assert any(r[1] == "± 5" for r in shown)  # the count asked by accuracy
    # 18.125 of the dataset's 20 is left; a count at ε 0.1 fits 181 times.
    count = next(k for k in expected["kinds"] if k["kind"] == "count")["at_default"]
    assert count["fits"] == 181
    assert client.get("budgets?dataset=d&accuracy=-1").status == 400


def form_fields(page: str) -> dict[str, str]:
    """The fields the change form sends: each control's name and its tag."""
    start = page.index('<form class="change"')
    form = page[start : page.index("</form>", start)]
    return dict(
        (name, tag)
        for tag, name in re.findall(r'<(input|select|textarea)[^>]*name="([^"]+)"', form)
    )


@pytest.mark.parametrize(
    ("kind", "naming"),
    [
        ("user", {"holder": "input"}),
        ("notebook", {"holder": "input", "notebook": "input"}),
        ("group", {"holder": "select"}),
        ("dataset", {}),
    ],
)
def test_the_change_form_has_only_its_kinds_fields(
    client: Client, kind: str, naming: dict[str, str]
) -> None:
    """Each kind of budget gets a form of the fields it uses, so nothing typed for
    another kind is sent with it (a notebook with a user's grant)."""
    page = client.get(f"change?budget={kind}&holder=alice&notebook=hw1.ipynb").body
    common = {"_csrf": "input", "budget": "input", "dataset": "select", "epsilon": "input",
              "delta": "input", "reason": "textarea"}  # fmt: skip
    assert form_fields(page) == {**common, **naming}
    assert f'<input type="hidden" name="budget" value="{kind}">' in page
    assert re.findall(r'<a href="[^"]*" class="on" aria-current="page">', page) != []
    if kind == "group":
        assert '<option value="ta">ta</option>' in page  # the policy's groups, no typing


def test_the_change_page_asks_which_budget_first(client: Client) -> None:
    page = client.get("change").body
    assert '<form class="change"' not in page
    assert "Choose which budget" in page
    kinds = re.findall(r'<nav class="kinds".*?</nav>', page)[0]
    assert re.findall(r"budget=(\w+)", kinds) == ["user", "notebook", "group", "dataset"]
    # A user's name goes along to their notebook's budget, not to a group's.
    page = client.get("change?budget=user&holder=alice").body
    assert "budget=notebook&amp;holder=alice" in page
    assert "budget=group&amp;holder" not in page


def test_a_notebook_typed_for_a_users_budget_is_refused_not_dropped(
    client: Client, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trap: a notebook named with the kind left at "a user's" granted to the
    user's whole budget. Refused, nothing written; without the check (the broken
    version) the whole budget gets it."""
    form = {"dataset": "d", "budget": "user", "holder": "alice", "notebook": "hw1.ipynb",
            "epsilon": "1", "reason": "hw1 retake"}  # fmt: skip
    before = history(policy)
    reply = client.post("grant", {**form, "_csrf": client.csrf()})
    assert reply.status == 400 and "choose “a user&#x27;s notebook&#x27;s”" in reply.body
    assert history(policy) == before

    monkeypatch.setattr(ChangeForm, "check_fields", lambda self: None)
    assert client.post("grant", {**form, "_csrf": client.csrf()}).status == 303
    assert history(policy)[0]["sql"].endswith("hw1 retake")
    assert "granted ε=1 to the budget of user alice on dataset" in client.get("log").body


def history(policy: Policy) -> list[dict[str, Any]]:
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        return ledger.history()


GRANT = {"dataset": "d", "budget": "user", "epsilon": "0.5", "reason": "lab 3"}


@pytest.mark.parametrize("user", ["alice", "carol", "dave"])
def test_a_grant_to_a_user_the_gate_knows_is_made_at_once(
    client: Client, policy: Policy, user: str
) -> None:
    """alice is in group ta, carol in the ledger; dave is in the gate's tokens file."""
    tokens = policy.path.parent / "tokens.toml"
    tokens.write_text('[users]\ndave = "dave-token-0123456789abcdef"\n')
    tokens.chmod(0o600)
    # As if the policy named it in [gate] (the console reads the same Policy object).
    object.__setattr__(policy.gate, "tokens_file", tokens)
    reply = client.post("grant", {**GRANT, "holder": user, "_csrf": client.csrf()})
    assert reply.status == 303, reply.body


def test_a_grant_to_a_user_nobody_knows_waits_for_a_confirmation_naming_them(
    client: Client, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "dna" for "ana": asked about, with the close known names, nothing written;
    made once confirmed by a request naming the user it creates (and only that user).
    Without the step (the broken version) the misspelt user is granted at once."""
    before = history(policy)
    form = {**GRANT, "holder": "alcie", "_csrf": client.csrf()}
    reply = client.post("grant", form)
    assert reply.status == 409
    assert "No user <b>alcie</b> is known to this gate" in reply.body
    suggestion = re.search(r'Did you mean <a href="([^"]+)"><b>alice</b></a>\?', reply.body)
    assert suggestion is not None  # a link to the same form for alice
    assert "holder=alice" in suggestion.group(1) and "epsilon=0.5" in suggestion.group(1)
    assert "it looked in the policy&#x27;s groups, the ledger)" in reply.body
    assert '<input type="hidden" name="create" value="alcie">' in reply.body
    assert "Create user alcie and grant ε=0.5" in reply.body
    assert client.post("grant", {**form, "create": "alice"}).status == 409
    assert client.post("grant", {**form, "budget": "notebook", "notebook": "n.ipynb"}).status == 409
    assert history(policy) == before

    assert client.post("grant", {**form, "create": "alcie"}).status == 303
    assert history(policy)[0]["user"] == "alcie" and len(history(policy)) == len(before) + 1
    # Known now (the ledger has them): the next grant is made at once.
    assert client.post("grant", form).status == 303

    monkeypatch.setattr(console_server, "needs", lambda *args: None)
    assert client.post("grant", {**form, "holder": "dna"}).status == 303
    assert history(policy)[0]["user"] == "dna"


def test_a_reset_waits_for_its_confirmation(
    client: Client, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset is made only by a second request that confirms it, from a page that
    names the budget and what it spent. Without the step (the broken version), the
    button beside Grant resets at once."""
    form = {"dataset": "d", "budget": "user", "holder": "alice", "reason": "new term",
            "_csrf": client.csrf()}  # fmt: skip
    before = history(policy)
    reply = client.post("reset", form)
    assert reply.status == 409
    assert "Reset the budget of user alice on dataset &#x27;d&#x27;" in reply.body
    assert "spent ε=0.75 of its limit ε=5" in reply.body
    assert '<input type="hidden" name="confirm" value="reset">' in reply.body
    assert client.post("reset", {**form, "confirm": "yes"}).status == 409
    assert history(policy) == before
    assert client.post("reset", {**form, "confirm": "reset"}).status == 303
    assert history(policy)[0]["status"] == "reset"

    # An unknown user's reset: one step confirms both.
    reply = client.post("reset", {**form, "holder": "zoe"})
    assert reply.status == 409 and "Create user zoe and reset their budget" in reply.body
    assert client.post("reset", {**form, "holder": "zoe", "confirm": "reset"}).status == 409
    assert (
        client.post("reset", {**form, "holder": "zoe", "confirm": "reset", "create": "zoe"}).status
        == 303
    )

    monkeypatch.setattr(console_server, "needs", lambda *args: None)
    count = len(history(policy))
    assert client.post("reset", form).status == 303
    assert len(history(policy)) == count + 1
