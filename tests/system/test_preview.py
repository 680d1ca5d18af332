"""The utility preview through a real gate process: ``GET /v1/budget?preview=true``
says how many more counts fit at an accuracy, and exactly that many are answered
before the next is refused as over budget; ``%dpbudget --accuracy`` shows the gate's
numbers when asked for them.

Through real processes; the in-process tests of the same subject are in
tests/unit/test_preview.py, tests/unit/dp/test_preview.py and
tests/unit/test_preview_view.py."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from dpmagic.client.http_gate import Gate
from tests.server_gate import call
from tests.shells import connected, ipython, shell  # noqa: F401

# The gate's dataset: one row per person, a notebook budget of ε = 2 (tests/conftest.py).
# A count's 95% interval of ±6 costs about ε = ln(20)/6 ≈ 0.5, so four fit.
ACCURACY = 6.0


def test_as_many_counts_as_the_preview_says_are_answered_then_one_is_refused(gate):
    status, reply = call(
        gate.address, "GET", f"/v1/budget?notebook=nb&preview=true&accuracy={ACCURACY}"
    )
    assert status == 200
    (count,) = [k for k in reply["preview"]["kinds"] if k["kind"] == "count"]
    option = count["at_accuracy"]
    n = option["fits"]
    assert 3 <= n <= 6 and option["ask"] == {"accuracy": ACCURACY, "alpha": 0.05}
    query = {"sql": count["sql"], "accuracy": ACCURACY, "notebook": "nb", "fresh": True}
    for _ in range(n):
        status, answer = call(gate.address, "POST", "/v1/query", query)
        assert status == 200 and answer["cost"] == option["cost"]
        assert answer["plan"][0]["requested"]["half_width"] == option["half_width"] <= ACCURACY
    status, refused = call(gate.address, "POST", "/v1/query", query)
    assert status == 403 and refused["error"]["kind"] == "budget"
    _, after = call(gate.address, "GET", f"/v1/budget?notebook=nb&preview=true&accuracy={ACCURACY}")
    (count,) = [k for k in after["preview"]["kinds"] if k["kind"] == "count"]
    assert count["at_accuracy"]["fits"] == 0
    assert after["notebook"]["spent"]["epsilon"] == pytest.approx(n * option["cost"]["epsilon"])
    status, error = call(gate.address, "GET", "/v1/budget?accuracy=6")
    assert status == 400 and "preview=true" in error["error"]["message"]


@pytest.fixture
def notebook(connected: InteractiveShell, monkeypatch) -> InteractiveShell:  # noqa: F811
    """The shared shell on this module's gate, in a notebook named ``hw.ipynb``."""
    monkeypatch.setenv("JPY_SESSION_NAME", "hw.ipynb")
    return connected


def test_dpbudget_shows_the_gates_preview(notebook, gate):
    view = notebook.run_line_magic("dpbudget", f"--accuracy {ACCURACY:g} --rows 100")
    (entry,) = view.datasets
    asked = Gate(gate.address).budget("d", "hw.ipynb", accuracy=ACCURACY, rows=100)
    assert entry.preview == asked["preview"]
    count, mean = entry.preview["kinds"][:2]
    assert (count["kind"], mean["kind"], mean["column"], mean["rows"]) == ("count", "mean",
                                                                            "age", 100)  # fmt: skip
    text, html = repr(view), view._repr_html_()
    epsilon = mean["at_accuracy"]["ask"]["epsilon"]
    for shown in (text, html):
        assert f"--accuracy {ACCURACY:g}" in shown and f"-e {epsilon:g}" in shown
        assert "-e 0.1 (the default)" in shown and "over a group of 100 rows" in shown
    # The default-ε line of a count: ±30 at ε = 0.1, 20 of them in the notebook's 2.
    assert count["at_default"]["fits"] == 20 and "±30" in text
    default = notebook.run_line_magic("dpbudget", "--preview")
    assert all(k["at_accuracy"] is None for k in default.datasets[0].preview["kinds"])
    # Not asked for, not planned: a plain %dpbudget is what a graded run shows offline.
    plain = notebook.run_line_magic("dpbudget", "")
    assert plain.datasets[0].preview is None and "more that fit" not in plain._repr_html_()
    with pytest.raises(UsageError, match="whole number"):
        notebook.run_line_magic("dpbudget", "--rows 0")
