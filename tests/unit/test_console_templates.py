"""The console's pages come from templates with escaping on: every text a user, an
owner or the policy chose is written as text on every page, and no console module
builds HTML itself.

Each such text below is hostile: written raw, it would leave an attribute, open a
script and an image with a handler, and leave a bare ``&``. Every page is read over
real HTTP with one in every field it shows (``tests/consoles.py`` serves it), and
none may appear raw; each must appear escaped, so that the check is not passed by a
page that leaves the field out. With escaping off (the broken version), the same
check finds raw markup on every one of those pages.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from tornado.escape import xhtml_escape
from tornado.template import Loader

from dpmagic.gate import owner
from dpmagic.gate.console import layout
from dpmagic.gate.console.owners import Owner, Way
from dpmagic.gate.console.server import Console
from dpmagic.gate.dp.accounting import Cost, PureAccountant
from dpmagic.gate.ledger.scopes import Scope, applicable
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Budget, Policy, load_policy
from tests.conftest import write_dataset
from tests.consoles import Answer, Client, served

CONSOLE = Path(layout.__file__).parent


def hostile(field: str) -> str:
    """A text for ``field`` that is markup if written raw. No slash: a folder is named
    by one."""
    return f"\"'><script>{field}<img src=x onerror={field}>&{field}"


def shown(field: str) -> str:
    """``hostile(field)`` as an escaped page shows it, whole or inside a ``repr`` (an
    error message's, which quotes it): the part without quotes."""
    return xhtml_escape(hostile(field)[3:])


# What a raw hostile text leaves on a page: the pages have no script or image of
# their own, and write every ``&`` as the start of an entity.
RAW = re.compile(r"<script|<img|&(?!#?\w+;)", re.IGNORECASE)

DATASET, GROUP, MEMBER = hostile("dataset"), hostile("group"), hostile("member")
USER, NOTEBOOK, SQL = (
    hostile("user"),
    hostile("notebook"),
    f"SELECT COUNT(*) FROM t -- {hostile('sql')}",
)
REFUSAL, GRANTEE, WHY = hostile("refusal"), hostile("grantee"), hostile("why")
OWNER = hostile("owner")


def hostile_policy(tmp_path: Path) -> Policy:
    """The tests' dataset named ``DATASET``, with renewing budgets of each kind (so that
    the renewals page names their holders), group ``GROUP`` of ``USER`` and ``MEMBER``,
    and a plain dataset ``d`` beside it (so that the budgets page offers a choice), in
    a folder with a hostile name (the overview shows the policy's path)."""
    folder = tmp_path / hostile("folder")
    folder.mkdir()
    text = write_dataset(folder).read_text()
    plain = text[text.index("[datasets.d]") :]
    named = plain.replace("[datasets.d", f"[datasets.{json.dumps(DATASET)}")
    named = named.replace(
        "user_budget = { epsilon = 5.0 }\nnotebook_budget = { epsilon = 2.0 }\n",
        'user_budget = { epsilon = 5.0, renew = "week" }\n'
        'notebook_budget = { epsilon = 2.0, renew = "day" }\n'
        f'group_budgets = {{ {json.dumps(GROUP)} = {{ epsilon = 8.0, renew = "month" }} }}\n',
    )
    groups = f"\n[groups]\n{json.dumps(GROUP)} = {json.dumps([USER, MEMBER])}\n"
    path = folder / "policy.toml"
    path.write_text(text + "\n" + named + groups)
    return load_policy(path)


def seed_hostile(policy: Policy) -> None:
    """A charge and a refusal of ``USER``'s, and a grant to ``GRANTEE`` with a reason."""
    ds = policy.dataset(DATASET)
    ledger = Ledger(policy.gate.state_dir / owner.LEDGER_FILE, PureAccountant())
    try:
        ledger.debit(
            user=USER, dataset=DATASET, notebook=NOTEBOOK, cost=Cost(0.5),
            limits=applicable(ds, USER, NOTEBOOK, frozenset({GROUP})), sql=SQL,
            replay_key="key", groups=frozenset({GROUP}),
        )  # fmt: skip
        ledger.record_refusal(
            user=USER, dataset=DATASET, notebook=NOTEBOOK, sql=SQL, reason=REFUSAL
        )
        owner.apply(ledger, owner.grant(Scope.user(DATASET, GRANTEE), Budget(1.0), OWNER, WHY))
    finally:
        ledger.close()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    policy = hostile_policy(tmp_path)
    seed_hostile(policy)
    console = Console(policy, "/", None, Owner(OWNER, Way.UNIX))
    with served(console) as base:
        client = Client(base)
        assert client.get(f"login?token={console.sessions.login_token()}").status == 303
        yield client


def query(path: str, **fields: str) -> str:
    return f"{path}?{urlencode(fields)}"


def every_page(client: Client) -> Iterator[tuple[str, Answer, int, tuple[str, ...]]]:
    """Each page the console draws, as a browser gets it: what was asked, the answer,
    its status, and the fields whose hostile text it must show."""
    get = [
        ("", 200, ("folder", "dataset", "group", "member", "owner")),
        ("budgets", 200, ("dataset", "group", "user", "notebook", "grantee")),
        (query("budgets", dataset=DATASET, budget="notebook", holder=USER, notebook=NOTEBOOK),
         200, ("dataset", "user", "notebook")),
        (query("budgets", dataset=DATASET, budget="group", holder=GROUP), 200, ("group",)),
        ("log", 200, ("dataset", "user", "notebook", "sql", "refusal", "grantee", "why", "owner")),
        (query("log", dataset=DATASET, user=hostile("user filter"),
               notebook=hostile("notebook filter"), q=hostile("text filter")),
         200, ("dataset", "user filter", "notebook filter", "text filter")),
        ("renewals", 200, ("dataset", "group", "user", "notebook")),
        ("change", 200, ("owner",)),
        (query("change", dataset=DATASET, budget="user", holder=hostile("holder"),
               epsilon=hostile("epsilon"), delta=hostile("delta"), reason=hostile("reason")),
         200, ("dataset", "holder", "epsilon", "delta", "reason", "user", "member", "grantee")),
        (query("change", dataset=DATASET, budget="notebook", holder=USER,
               notebook=hostile("typed notebook")), 200, ("user", "typed notebook")),
        (query("change", dataset=DATASET, budget="group"), 200, ("dataset", "group")),
        (query("log", status=hostile("status")), 400, ("status",)),
        (query("budgets", dataset=DATASET, accuracy=hostile("accuracy")), 400, ("accuracy",)),
    ]  # fmt: skip
    for path, status, fields in get:
        yield path, client.get(path), status, fields
    csrf = client.csrf()
    grant = {"dataset": DATASET, "budget": "user", "epsilon": "1", "reason": WHY, "_csrf": csrf}
    post = [
        ("grant", {**grant, "budget": "group", "holder": hostile("no group")}, 400,
         ("no group", "why")),
        ("grant", {**grant, "holder": USER, "notebook": hostile("stray")}, 400, ("user", "stray")),
        ("grant", {**grant, "holder": hostile("usr")}, 409, ("usr", "user", "why", "dataset")),
        ("reset", {**grant, "budget": "notebook", "holder": USER, "notebook": NOTEBOOK}, 409,
         ("user", "notebook", "dataset", "why")),
    ]  # fmt: skip
    for path, form, status, fields in post:
        yield f"POST {path} {form}", client.post(path, form), status, fields
    assert client.post("grant", {**grant, "holder": GRANTEE}).status == 303
    yield "log after a grant", client.get("log"), 200, ("grantee", "dataset")


def test_every_page_writes_every_chosen_text_as_text(client: Client) -> None:
    for asked, reply, status, fields in every_page(client):
        assert reply.status == status, (asked, reply.body)
        assert RAW.findall(reply.body) == [], asked
        for field in fields:
            assert shown(field) in reply.body, (asked, field)


def test_with_escaping_off_every_page_is_caught(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken version: the same templates loaded without escaping. Each page then
    shows some text raw, and the check above finds it."""
    raw = Loader(
        str(layout.TEMPLATES),
        autoescape=None,
        whitespace="oneline",
        namespace=layout.LOADER.namespace,
    )
    monkeypatch.setattr(layout, "LOADER", raw)
    for asked, reply, status, _ in every_page(client):
        assert reply.status == status, (asked, reply.body)
        assert RAW.findall(reply.body) != [], asked


# The template directives a page may use: none writes a value unescaped (``raw``,
# ``autoescape``, ``module`` and ``apply`` could).
DIRECTIVES = {"extends", "block", "include", "if", "elif", "else", "for", "set", "end"}


def test_the_templates_are_loaded_with_escaping_on_and_never_write_raw() -> None:
    assert layout.LOADER.autoescape == "xhtml_escape"
    templates = sorted(layout.TEMPLATES.glob("*.html"))
    assert len(templates) > 10
    for template in templates:
        used = set(re.findall(r"{%\s*(\w+)", template.read_text()))
        assert used <= DIRECTIVES, (template.name, used - DIRECTIVES)


# An HTML tag's start (``<p>``, ``</td>``, ``<a href=``, ``<!doctype``), and not a
# regular expression's named group (``(?P<path>.*)``, server.py's route).
TAG = re.compile(r"(?<!\?P)</?[a-zA-Z][\w-]*(?=[\s/>])|<!")


def html_in(source: str) -> list[str]:
    """The string literals (f-strings' parts among them) of a module that hold an HTML
    tag, its docstrings aside (they describe the pages, and build nothing)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and TAG.search(node.value)
    ]


def test_no_console_module_builds_html() -> None:
    """Every tag is in a template: the modules hand them text. ``html_in`` finds the
    broken version, a page built by f-string."""
    assert html_in("def page(name):\n    return f'<p>{name}</p>'\n") == ["<p>", "</p>"]
    for module in sorted(CONSOLE.glob("*.py")):
        source = module.read_text()
        assert html_in(source) == [], module.name
        assert "import html" not in source, module.name  # escaping is the templates' alone
