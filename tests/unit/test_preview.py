"""The utility preview of ``GET /v1/budget?preview=true`` (``gate/preview.py``), on a real
engine under each accountant: each kind's cost is what the gate charges for the same
request, its half-width what the dry run states, the number that fit is the number the
ledger then lets through, and making it reads no data and charges nothing."""

from __future__ import annotations

import math
import textwrap

import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.padding import PrivateRead
from dpmagic.gate.policy import load_policy
from dpmagic.gate.preview import PreviewRequest, kinds
from dpmagic.gate.service.routes import ROUTES, HTTPError
from tests.gate_helpers import dataset, make_plan
from tests.small_gate import write_policy

POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
accountant = "{accountant}"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = 2.0, delta = {delta} }}
notebook_budget = {{ epsilon = 1.5, delta = {delta} }}
query_default = {{ epsilon = 0.25, delta = {query_delta} }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""
# (δ of the budgets, δ of a query by default): under approx δ runs out as ε does.
DELTAS = {"pure": (0.0, 0.0), "approx": (1e-5, 2e-6), "zcdp": (1e-5, 0.0)}
ACCURACY = 15.0  # a count's ± in rows, a mean's in years of age
ROWS = 100  # one of the dry run's stated group sizes (``summary.GROUP_SIZES``)
COUNT, MEAN = "SELECT COUNT(*) FROM t", "SELECT AVG(age) FROM t"


def _engine(folder, accountant: str) -> Engine:
    write_policy(folder, rows=300)
    delta, query_delta = DELTAS[accountant]
    text = POLICY.format(accountant=accountant, delta=delta, query_delta=query_delta)
    (folder / "policy.toml").write_text(textwrap.dedent(text))
    return Engine(load_policy(folder / "policy.toml"))


@pytest.fixture(params=list(DELTAS))
def engine(request, tmp_path):
    e = _engine(tmp_path, request.param)
    yield e
    e.close()


@pytest.fixture(scope="module", params=list(DELTAS))
def unspent(request, tmp_path_factory):
    """One engine an accountant for the tests that only preview and dry-run, charging
    nothing: a preview at an accuracy takes seconds under approx and zCDP, and the
    engine answers the same preview again from what it found."""
    e = _engine(tmp_path_factory.mktemp(request.param), request.param)
    yield e
    e.close()


def previewed(engine: Engine, user: str, rows: int = ROWS) -> dict[str, dict]:
    """The preview's kinds by their SQL."""
    reply = engine.budget(user, None, "nb", PreviewRequest(ACCURACY, rows))
    return {entry["sql"]: entry for entry in reply["preview"]["kinds"]}


def body(entry: dict, option: dict, **more: object) -> dict:
    """The request the option says to send."""
    return {"sql": entry["sql"], **option["ask"], "notebook": "nb", **more}


def stated(reply: dict, rows: int) -> float:
    """The half-width a dry run states for its one output, at ``rows`` rows for a mean."""
    (output,) = [s for s in reply["plan"] if s["kind"] == "output"]
    if output.get("half_width") is not None:
        return output["half_width"]
    return dict(output["half_width_at"])[rows]


def test_the_preview_prices_a_count_and_each_bounded_mean(unspent):
    engine = unspent
    reply = engine.budget("ann", None, "nb", PreviewRequest(ACCURACY, ROWS))
    assert set(reply) == {"dataset", "user", "notebook", "preview"}
    preview = reply["preview"]
    assert (preview["accuracy"], preview["alpha"], preview["rows"]) == (ACCURACY, 0.05, ROWS)
    assert preview["rows_basis"] == "asked"
    count, mean, share = preview["kinds"]  # sex is bounded by its public values, 0 and 1
    assert [count[k] for k in ("kind", "table", "column", "rows")] == ["count", "t", None, None]
    assert (mean["kind"], mean["column"], mean["rows"], mean["sql"]) == ("mean", "age", ROWS, MEAN)
    assert share["sql"] == "SELECT AVG(sex) FROM t"
    assert count["at_accuracy"]["ask"] == {"accuracy": ACCURACY, "alpha": 0.05}
    assert set(mean["at_accuracy"]["ask"]) == {"epsilon", "delta"}
    # Without an accuracy: only the default ε; without preview=true, no preview at all.
    plain = engine.budget("ann", None, "nb", PreviewRequest())["preview"]
    assert plain["accuracy"] is None and plain["rows"] == 1000
    # 1,000 rows is the gate's assumption, not the data's size (300 rows here): it says so
    assert plain["rows_basis"] == "default"
    assert all(k["at_accuracy"] is None and k["at_default"]["fits"] > 0 for k in plain["kinds"])
    assert "preview" not in engine.budget("ann", None, "nb")


def test_each_cost_and_half_width_is_what_the_gate_charges_and_states(unspent):
    engine = unspent
    for rows in (100, 1000):
        entries = previewed(engine, "ann", rows)
        for entry in entries.values():
            for basis in ("at_accuracy", "at_default"):
                option = entry[basis]
                dry = engine.query("ann", body(entry, option, dry_run=True))
                assert dry["cost"] == option["cost"], (entry["sql"], basis)
                assert stated(dry, rows) == option["half_width"], (entry["sql"], basis)
            assert entry["at_accuracy"]["half_width"] <= ACCURACY
        # The mean's ε is the least, to its three digits: one digit less misses the accuracy.
        mean = entries[MEAN]["at_accuracy"]
        epsilon = mean["ask"]["epsilon"]
        less = epsilon - 10 ** (math.floor(math.log10(epsilon)) - 2)
        dry = engine.query("ann", {"sql": MEAN, "epsilon": less, "dry_run": True})
        assert stated(dry, rows) > ACCURACY
    # A mean over ten times the rows is about ten times as accurate: it needs less ε.
    assert (
        entries[MEAN]["at_accuracy"]["ask"]["epsilon"]
        < previewed(engine, "ann")[MEAN]["at_accuracy"]["ask"]["epsilon"]
    )


# Under pure in the default run, under the other accountants with the searches
# (``-m search``): up to 60 queries a way below; the route's checks further on, which
# do not depend on the accountant, but a preview at a small accuracy is slow under approx.
ONE_ACCOUNTANT = pytest.mark.parametrize(
    "engine",
    ["pure", *(pytest.param(name, marks=pytest.mark.search) for name in ("approx", "zcdp"))],
    indirect=True,
)


@ONE_ACCOUNTANT
def test_as_many_as_fit_are_answered_and_the_next_is_refused(engine):
    """For each kind and way to ask: ``fits`` queries of it are charged what the preview
    says, one more is refused as over budget, and then the preview says none fit. Every
    other user first spends ε = 1 in another notebook, so that under pure and approx the
    user's budget is the tighter (1 left, the notebook 1.5); for the others the
    notebook's is."""
    seen = []
    for i, (sql, basis) in enumerate(
        (sql, basis) for sql in (COUNT, MEAN) for basis in ("at_accuracy", "at_default")
    ):
        for tighter in ("user", "notebook"):
            user = f"u{i}{tighter}"
            if tighter == "user":
                engine.query(user, {"sql": COUNT, "epsilon": 1.0, "notebook": "other"})
            entry = previewed(engine, user)[sql]
            option = entry[basis]
            n = option["fits"]
            assert 1 <= n <= 60, (sql, basis, n)
            for _ in range(n):
                reply = engine.query(user, body(entry, option, fresh=True))
                assert reply["cost"] == option["cost"]
            with pytest.raises(OverBudget):
                engine.query(user, body(entry, option, fresh=True))
            assert previewed(engine, user)[sql][basis]["fits"] == 0
            seen.append(n)
    assert len(set(seen)) > 2  # the ways differ in what they cost


def test_a_preview_reads_no_data_and_charges_nothing(engine, monkeypatch):
    def touched(*args: object, **kwargs: object) -> None:
        raise AssertionError("the preview touched the data")

    store = engine.databases["d"]
    for method in ("run", "vet"):
        monkeypatch.setattr(store, method, touched)
    before = engine.budget("ann", None, "nb")
    reads = PrivateRead()
    reply = ROUTES["/v1/budget"].run(engine, "ann", "preview=true&accuracy=15", b"", reads)
    assert len(reply["preview"]["kinds"]) == 3 and not reads.began
    assert engine.budget("ann", None, "nb") == before


@ONE_ACCOUNTANT
def test_the_route_checks_the_preview_parameters(engine):
    def get(query: str) -> dict:
        return ROUTES["/v1/budget"].run(engine, "ann", query, b"", PrivateRead())

    reply = get("notebook=nb&preview=true&accuracy=2.5&rows=40")
    assert (reply["preview"]["accuracy"], reply["preview"]["rows"]) == (2.5, 40)
    assert get("preview=true")["preview"]["rows"] == 1000
    assert "preview" not in get("notebook=nb") and "preview" not in get("preview=false")
    refused = {
        "accuracy=2": "add preview=true",
        "rows=10": "add preview=true",
        "preview=yes": "true or false",
        "preview=true&accuracy=0": "positive number",
        "preview=true&accuracy=-1": "positive number",
        "preview=true&accuracy=nan": "positive number",
        "preview=true&accuracy=inf": "positive number",
        "preview=true&accuracy=ten": "positive number",
        "preview=true&rows=0": "whole number",
        "preview=true&rows=1.5": "whole number",
        "preview=true&rows=%C2%B2": "whole number",  # "²", a digit to str.isdigit
        "preview=true&rows=9999999999999": "whole number",
    }
    for query, message in refused.items():
        with pytest.raises(HTTPError, match=message) as caught:
            get(query)
        assert caught.value.status == 400


def test_kinds_are_read_from_the_policy():
    """The unit's table is counted (not a table linked to it, nor a public one); each
    numeric column with both bounds is averaged, but not an identifier, a link or a
    randomized-response column; names SQL reserves are quoted, and every kind plans."""
    ds = dataset(
        {
            "pid": {"type": "int"},
            "age": {"type": "int", "lower": 0, "upper": 100},
            "income": {"type": "float", "lower": 0, "upper": 1e5},
            "height": {"type": "float"},
            "smoker": {"type": "int", "public_values": [0, 1],
                       "randomized_response": {"p": 0.75}},
            "name": {"type": "str"},
        },
        table="order",
        more_tables={
            "visits": {
                "links": {"pid": "order.pid"},
                "columns": {"pid": {"type": "int", "lower": 0, "upper": 10**6},
                            "cost": {"type": "float", "lower": 0, "upper": 500}},
            },
            "prices": {"public": True,
                       "columns": {"p": {"type": "int", "lower": 0, "upper": 9}}},
        },
    )  # fmt: skip
    found = [(k.kind, k.table, k.column, k.sql) for k in kinds(ds)]
    assert found == [
        ("count", "order", None, 'SELECT COUNT(*) FROM "order"'),
        ("mean", "order", "age", 'SELECT AVG(age) FROM "order"'),
        ("mean", "order", "income", 'SELECT AVG(income) FROM "order"'),
        ("mean", "visits", "cost", "SELECT AVG(cost) FROM visits"),
    ]
    for kind in kinds(ds):
        assert make_plan(kind.sql, ds).cost.epsilon == 1.0
    rows = dataset({"x": {"type": "int", "lower": 0, "upper": 5}}, unit=None)
    assert [(k.kind, k.table) for k in kinds(rows)] == [("count", "t"), ("mean", "t")]


SHARED = """
[gate]
state_dir = "state"

[groups]
lab = ["carol", "dave"]

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
dataset_budget = { epsilon = 2.0 }
group_budgets = { lab = { epsilon = 1.2 } }
user_budget = { epsilon = 2.0 }
notebook_budget = { epsilon = 1.5 }
query_default = { epsilon = 0.25 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
age = { type = "int", lower = 0, upper = 100 }
"""


def test_a_group_and_the_dataset_budget_count_too(tmp_path):
    """Every budget the debit checks bounds the count: a group's, shared by its
    members (carol's queries leave dave less), then the dataset's, shared by all."""
    write_policy(tmp_path, rows=300)
    (tmp_path / "policy.toml").write_text(textwrap.dedent(SHARED))
    engine = Engine(load_policy(tmp_path / "policy.toml"))
    try:

        def fits(user: str) -> int:
            entry = engine.budget(user, None, "nb", PreviewRequest())["preview"]["kinds"][0]
            return entry["at_default"]["fits"]

        def spend(user: str, times: int) -> None:
            for _ in range(times):
                engine.query(user, {"sql": COUNT, "notebook": "nb", "fresh": True})

        assert fits("dave") == 4  # the group's 1.2, at ε = 0.25 a count
        spend("carol", 2)  # the group's, and the dataset's
        assert fits("dave") == 2 and fits("erin") == 6  # erin is in no group: her notebook's
        spend("dave", 2)
        # The dataset has 1.0 left, less than erin's notebook's 1.5.
        assert fits("dave") == 0 and fits("erin") == 4
        with pytest.raises(OverBudget):
            spend("dave", 1)
        spend("erin", 4)
        assert fits("erin") == 0 and fits("frank") == 0  # the dataset's 2.0 is spent
        with pytest.raises(OverBudget):
            spend("frank", 1)
    finally:
        engine.close()
