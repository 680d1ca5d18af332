"""JupyterLab in a real browser: ``dpmagic lab`` driven by Chromium through Playwright.

A user's view, end to end: the gate on the clinic example, JupyterLab with
the gated kernel, the quickstart opened and run from the Run menu, then a
refused ``%%dpsql`` cell typed in and run. What the user would see is
asserted in the page (tables, the intervals beside their values, the budget footer and its
bars, the refusals, ``%dpbudget``), in the light and the dark theme, and
screenshots are kept in ``test-artifacts/``.

Run with ``python -m pytest -m browser`` (``.ci/run`` does). It needs
Debian's ``chromium`` and Playwright's Python client; Playwright's own
browser download is never used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmagic.client.http_gate import Gate
from dpmagic.commands.demo import NOTEBOOK, example_file
from dpmagic.display.render import budget_number
from tests.chromium import ARTIFACTS, CHROMIUM, FLAGS, playwright_api

pytestmark = pytest.mark.browser
pytest.importorskip("jupyterlab", reason="JupyterLab is the optional extra dpmagic[lab]")
sync_api = playwright_api()
TOKEN = "dpmagic-browser-test-token"
LAB_START_S = 120
RUN_ALL_S = 60
STEP_MS = 60_000
SETTINGS = {
    "@jupyterlab/apputils-extension/notification": '{"fetchNews": "false"}',
    "@jupyterlab/notebook-extension/tracker": '{"windowingMode": "none"}',
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    """``dpmagic lab --no-browser`` on a small clinic; yields its base URL."""
    port = _free_port()
    env = {
        **os.environ,
        "JUPYTER_TOKEN": TOKEN,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
    }
    env = {k: v for k, v in env.items() if not k.startswith(("DPMAGIC_", "JPY_"))}
    # No "news" prompt over the page (this lab has no network to fetch it anyway), and
    # every cell rendered, not only those in view, so the whole page can be read.
    for name, value in SETTINGS.items():
        path = tmp_path / "settings" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "lab", "--no-browser", "--port", str(port),
         "--patients", "400", "--notebook-dir", str(tmp_path)],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + LAB_START_S
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "lab.log").read_text()) from None
                time.sleep(0.5)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # JupyterLab asks to confirm the first Ctrl-C
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


@pytest.fixture
def page(tmp_path: Path):
    """A Chromium page with a fresh profile."""
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 1000},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def _menu(page, *path: str) -> None:
    """Open a JupyterLab menu bar entry and click through its items."""
    page.locator(".lm-MenuBar-itemLabel", has_text=path[0]).first.click()
    for item in path[1:]:
        page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def _shoot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path


def test_quickstart_in_jupyterlab_shows_tables_budget_and_refusals(lab: str, page) -> None:
    try:
        _walk_through_the_quickstart(lab, page)
    except Exception:
        _shoot(page, "lab-failure.png")  # what the page showed when a step failed
        raise


def _walk_through_the_quickstart(lab: str, page) -> None:
    page.set_default_timeout(STEP_MS)
    page.goto(f"{lab}/lab/tree/quickstart.ipynb?token={TOKEN}")
    page.locator(".jp-Notebook").wait_for()
    # The notebook names the gated kernel: it opens on it, nothing to switch.
    page.locator(".jp-Toolbar-kernelName", has_text="Python 3 (dpmagic)").wait_for()
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for()
    _menu(page, "Run", "Run All Cells")

    # The last cell is %dpbudget: once it has rendered, every cell above has run.
    budget = page.locator(".dpmagic-budget")
    budget.wait_for(timeout=RUN_ALL_S * 1000)
    results = page.locator(".dpmagic-result")
    cells = _dpsql_cells()
    assert results.count() == len(cells)  # each answer, the mock run and the dry run's plan
    assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")\
        .count() == 0  # fmt: skip

    # The mock rehearsal is labelled in its table and its footer, and charged nothing.
    mock = results.nth(_index(cells, "--mock"))
    assert mock.locator(".dpm-mock").inner_text() == "mock data — not the real dataset"
    assert (
        mock.locator(".dpm-footer-text").inner_text().startswith("mock data — not the real dataset")
    )

    first = results.nth(_index(cells, "SELECT COUNT(*) AS visits"))
    first.scroll_into_view_if_needed()
    assert first.locator("th").all_inner_texts() == ["visits"]
    footer = first.locator(".dpm-footer-text").inner_text()
    assert footer.startswith("ε 0.1 spent · ")
    assert "left for the notebook" in footer and "left for the user" in footer
    assert first.locator("[role=meter]").count() == 2

    # Departments: every public key is a row; each interval beside its value, shown.
    departments = results.nth(_index(cells, "GROUP BY department\nORDER BY"))
    departments.scroll_into_view_if_needed()
    assert departments.locator("tbody tr").count() == 10
    interval = departments.locator(".dpm-int").first
    assert interval.is_visible() and interval.inner_text().startswith("[")
    assert departments.locator("details.dpm-toggle").count() == 0
    assert (
        departments.locator("td.dpm-noisy")
        .first.get_attribute("title")
        .startswith("95% interval [")
    )
    _shoot(page, "lab-result-light.png")

    # A median carries its interval in the column's units too, beside each value.
    medians = results.nth(_index(cells, "MEDIAN(v.cost)"))
    medians.scroll_into_view_if_needed()
    column = medians.locator("thead th").all_inner_texts().index("median_cost")
    cell = medians.locator("tbody tr").first.locator("td").nth(column)
    assert cell.locator(".dpm-int").inner_text().startswith("[")
    assert cell.get_attribute("title").startswith("95% interval [")
    assert "percentile of its group" in cell.get_attribute("title")
    _shoot(page, "lab-quantile-light.png")

    # The Python client's refusal, printed by the quickstart.
    assert page.get_by_text("refused: ", exact=False).count() >= 1
    # %dpbudget: the two scopes with bars, this notebook's queries and a chart.
    budget.scroll_into_view_if_needed()
    assert budget.locator("[role=meter]").count() == 2
    charged = [c for c in cells if not {"--dry-run", "--mock"} & set(c.splitlines()[0].split())]
    assert budget.locator("code").count() == len(charged)
    assert budget.locator("svg.dpm-chart").count() == 1
    _shoot(page, "lab-budget-light.png")

    # Noise that dominates is flagged, not shown as a plain number.
    costs = results.nth(_index(cells, "-o costs"))
    costs.scroll_into_view_if_needed()
    assert costs.locator(".dpm-flag", has_text="noise dominates").count() >= 1
    _shoot(page, "lab-noise-light.png")
    _check_the_extension(page)

    # A refused %%dpsql cell typed by the user fails with one line.
    page.locator(".jp-Cell").last.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.type("%%dpsql\nSELECT * FROM visits")
    page.keyboard.press("Shift+Enter")
    error = page.locator(".jp-OutputArea-output", has_text="query refused: ")
    error.wait_for()
    assert "UsageError" not in error.inner_text()  # the reason alone, on one line
    assert "Traceback" not in error.inner_text()
    _shoot(page, "lab-refusal-light.png")

    # The same page in the dark theme: the theme's colours, no white boxes.
    _menu(page, "Settings", "Theme", "JupyterLab Dark")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
    departments.scroll_into_view_if_needed()
    background = departments.evaluate(
        "el => getComputedStyle(el.closest('.jp-OutputArea-output')).backgroundColor"
    )
    assert background in ("rgba(0, 0, 0, 0)", "transparent") or _dark(background), background
    colour = departments.locator("td").first.evaluate("el => getComputedStyle(el).color")
    assert not _dark(colour), colour
    _shoot(page, "lab-result-dark.png")
    costs = page.locator(".dpmagic-result").nth(_index(_dpsql_cells(), "-o costs"))
    costs.scroll_into_view_if_needed()
    _shoot(page, "lab-noise-dark.png")
    dry = page.locator(".jp-CodeCell", has_text="stay_days > 0 AND sex = 'F'")
    dry.scroll_into_view_if_needed()
    keyword = _css_colour(page, "var(--jp-mirror-editor-keyword-color)")
    token = dry.locator(".cm-line span", has_text=re.compile("^SELECT$")).first
    assert token.evaluate("el => getComputedStyle(el).color") == keyword
    _shoot(page, "lab-sql-dark.png")
    refused = page.locator(".jp-CodeCell", has_text="SELECT * FROM visits").last
    refused.scroll_into_view_if_needed()
    refused.locator(".cm-content").click()
    page.keyboard.press("Control+End")
    page.keyboard.type("\nWHERE a")
    page.keyboard.press("Tab")
    completer = page.locator(".jp-Completer")
    completer.wait_for()
    offered = completer.locator(".jp-Completer-item .jp-Completer-match").all_inner_texts()
    assert {"age", "age_band", "and"} <= set(offered), offered
    _shoot(page, "lab-completion-dark.png")
    page.keyboard.press("Escape")


def _check_the_extension(page) -> None:
    """The prebuilt extension: active, %%dpsql edited as SQL, the kernel's completions
    shown, the notebook's and the user's ε left in the status bar."""
    config = page.evaluate(
        "() => JSON.parse(document.getElementById('jupyter-config-data').textContent)"
    )
    assert "dpmagic-jupyterlab" in [e["name"] for e in config["federated_extensions"]]
    status = page.locator(".dpmagic-budget-status")
    assert re.fullmatch(r"ε left: notebook [\d.]+ of 3 · you [\d.]+ of 10", status.inner_text()), (
        status.inner_text()
    )

    # SQL highlighting: keywords in a %%dpsql cell take the theme's keyword colour,
    # and a string literal ends where SQL says it does.
    dry = page.locator(".jp-CodeCell", has_text="stay_days > 0 AND sex = 'F'")
    dry.scroll_into_view_if_needed()
    keyword = _css_colour(page, "var(--jp-mirror-editor-keyword-color)")
    string = _css_colour(page, "var(--jp-mirror-editor-string-color)")
    for word in ("SELECT", "AND", "GROUP"):
        token = dry.locator(".cm-line span", has_text=re.compile(f"^{word}$")).first
        assert token.evaluate("el => getComputedStyle(el).color") == keyword, word
    quoted = dry.locator(".cm-line span", has_text=re.compile("^'F'$")).first
    assert quoted.evaluate("el => getComputedStyle(el).color") == string
    _shoot(page, "lab-sql-light.png")

    # Completion, from the kernel: columns, functions and keywords after `SELECT a`.
    page.locator(".jp-Cell").last.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.type("%%dpsql\nSELECT a")
    page.keyboard.press("Tab")
    completer = page.locator(".jp-Completer")
    completer.wait_for()
    offered = completer.locator(".jp-Completer-item .jp-Completer-match").all_inner_texts()
    assert {"age", "age_band", "avg", "abs", "and"} <= set(offered), offered
    _shoot(page, "lab-completion-light.png")
    page.keyboard.press("Escape")
    # ... and only table names after FROM; Enter takes the one offered.
    page.keyboard.type(" FROM p")
    page.keyboard.press("Tab")
    completer.wait_for()
    offered = completer.locator(".jp-Completer-item .jp-Completer-match").all_inner_texts()
    assert offered == ["patients"], offered
    _shoot(page, "lab-completion-from-light.png")
    page.keyboard.press("Enter")
    page.locator(".jp-Cell").last.locator(".cm-line", has_text="FROM patients").wait_for()


def _css_colour(page, value: str) -> str:
    """``value`` (e.g. a theme variable) as the browser computes it: ``rgb(…)``."""
    return page.evaluate(
        """value => { const probe = document.createElement('span');
        probe.style.color = value; document.body.appendChild(probe);
        const colour = getComputedStyle(probe).color; probe.remove(); return colour; }""",
        value,
    )


def _index(cells: list[str], text: str) -> int:
    """The position among the results of the first cell containing ``text``."""
    return next(i for i, c in enumerate(cells) if text in c)


def _dpsql_cells() -> list[str]:
    """The quickstart's ``%%dpsql`` cells that show a result (``--save`` only saves),
    read from the notebook the lab serves."""
    notebook = json.loads(example_file(NOTEBOOK).read_text())
    sources = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    return [s for s in sources if s.startswith("%%dpsql") and "--save" not in s.splitlines()[0]]


def _dark(css: str) -> bool:
    """Whether an ``rgb(…)``/``rgba(…)`` colour is dark (luminance under 0.5)."""
    parts = [float(p) for p in css[css.index("(") + 1 : -1].split(",")[:3]]
    r, g, b = (p / 255 for p in parts)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5


# The status bar's budget: asked of the gate, through the kernel.
BUDGET_NOTEBOOK = "budget.ipynb"
COUNT_VISITS = "%%dpsql -e 0.5\nSELECT COUNT(*) AS visits FROM visits"


def test_status_bar_asks_the_gate_on_load_reload_restart_and_refusal(
    lab: str, page, tmp_path: Path
) -> None:
    """The status bar shows the gate's figures for the notebook and its user: after a
    query, after a page reload, after a kernel restart and after a refused query, even
    when the budget was spent behind its back (here by this test, as the same user)."""
    try:
        _follow_the_budget(lab, page, tmp_path)
    except Exception:
        _shoot(page, "lab-status-failure.png")
        raise


def _follow_the_budget(lab: str, page, tmp_path: Path) -> None:
    page.set_default_timeout(STEP_MS)
    _write_notebook(tmp_path / BUDGET_NOTEBOOK, [COUNT_VISITS])
    gate = Gate(_gate_address(tmp_path))
    status = page.locator(".dpmagic-budget-status")

    def gate_says() -> dict:
        return gate.budget(None, BUDGET_NOTEBOOK)

    # Opened: the gate's figures before any query (nothing spent yet).
    page.goto(f"{lab}/lab/tree/{BUDGET_NOTEBOOK}?token={TOKEN}")
    page.locator(".jp-Toolbar-kernelName", has_text="Python 3 (dpmagic)").wait_for()
    fresh = gate_says()
    assert fresh["notebook"]["spent"]["epsilon"] == 0
    _expect_status(status, fresh)
    sync_api.expect(status).to_have_text("ε left: notebook 3 of 3 · you 10 of 10")
    _shoot(page, "lab-status-opened.png")

    # After a query: what the gate says now, the notebook's and the user's.
    page.locator(".jp-CodeCell").first.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    page.locator(".dpmagic-result").wait_for()
    spent = gate_says()
    assert spent["notebook"]["remaining"]["epsilon"] == pytest.approx(2.5)
    _expect_status(status, spent)
    title = status.get_attribute("title")
    assert f"{BUDGET_NOTEBOOK} has ε 2.5 of 3 left" in title, title
    assert "you have ε 9.5 of 10 left" in title, title
    _shoot(page, "lab-status-after-query.png")

    # After a page reload: asked again, not "no query yet".
    page.reload()
    page.locator(".jp-Toolbar-kernelName", has_text="Python 3 (dpmagic)").wait_for()
    _expect_status(status, spent)
    _shoot(page, "lab-status-after-reload.png")

    # Spent behind the status bar's back (same user, same notebook name): nothing polls,
    # so it shows what it was told until something asks again, here a kernel restart.
    gate.query("SELECT COUNT(*) AS n FROM patients", epsilon=0.4, notebook=BUDGET_NOTEBOOK)
    page.wait_for_timeout(1000)
    _expect_status(status, spent)
    _menu(page, "Kernel", "Restart Kernel…")
    page.locator(".jp-Dialog").get_by_role("button", name="Confirm Kernel Restart").click()
    restarted = gate_says()
    assert restarted["notebook"]["remaining"]["epsilon"] == pytest.approx(2.1)
    _expect_status(status, restarted)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for()
    _shoot(page, "lab-status-after-restart.png")

    # Spent again elsewhere, then a query the notebook can no longer afford: the gate
    # refuses it (nothing charged) and the status bar takes the gate's word after it.
    gate.query("SELECT COUNT(*) AS n FROM visits", epsilon=0.6, notebook=BUDGET_NOTEBOOK)
    before = gate_says()
    _expect_status(status, restarted)
    page.locator(".jp-Cell").last.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.type("%%dpsql -e 2\nSELECT COUNT(*) AS visits FROM patients")
    page.keyboard.press("Shift+Enter")
    error = page.locator(
        ".jp-OutputArea-output", has_text="not enough privacy budget in this notebook's budget: "
    )
    error.wait_for()
    refused = gate_says()
    assert refused["notebook"]["remaining"]["epsilon"] == pytest.approx(1.5)
    assert refused == before  # a refusal charges nothing
    _expect_status(status, refused)
    error.scroll_into_view_if_needed()
    _shoot(page, "lab-status-after-refusal.png")

    # A notebook whose kernel has no dpmagic has no item; back on this one, it is asked again.
    _write_notebook(tmp_path / "plain.ipynb", ["1 + 1"], kernel=("python3", "Python 3 (ipykernel)"))
    page.goto(f"{lab}/lab/tree/plain.ipynb?token={TOKEN}")
    plain = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    plain.locator(".jp-Toolbar-kernelName", has_text="Python 3 (ipykernel)").wait_for()
    plain.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for()
    plain.locator(".jp-CodeCell").first.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    plain.locator(".jp-OutputArea-output", has_text="2").wait_for()
    sync_api.expect(status).to_be_hidden()
    _shoot(page, "lab-status-plain-kernel.png")
    gate.query("SELECT COUNT(*) AS n FROM visits", epsilon=0.5, notebook=BUDGET_NOTEBOOK)
    page.locator(".lm-TabBar-tabLabel", has_text=BUDGET_NOTEBOOK).click()
    current = gate_says()
    assert current["notebook"]["remaining"]["epsilon"] == pytest.approx(1.0)
    _expect_status(status, current)


def _expect_status(status, budget: dict) -> None:
    """The status bar shows ``budget`` (a ``GET /v1/budget`` reply), the notebook's then
    the user's ε, printed as the footers print them (what is left to three significant
    digits, rounded down; the limit in full)."""
    nb, user = budget["notebook"], budget["user"]
    text = (
        f"ε left: notebook {budget_number(nb['remaining']['epsilon'])} of "
        f"{nb['limit']['epsilon']:g} · you {budget_number(user['remaining']['epsilon'])} of "
        f"{user['limit']['epsilon']:g}"
    )
    sync_api.expect(status).to_have_text(text, timeout=STEP_MS)


def _gate_address(tmp_path: Path) -> str:
    """The gate ``dpmagic lab`` started, from the kernelspec it says it wrote."""
    log = (tmp_path / "lab.log").read_text()
    spec = re.search(r"gated kernel installed in (.+)", log).group(1).strip()
    return json.loads((Path(spec) / "kernel.json").read_text())["env"]["DPMAGIC_GATE"]


def _write_notebook(
    path: Path, sources: list[str], kernel: tuple[str, str] = ("dpmagic", "Python 3 (dpmagic)")
) -> None:
    cells = [
        {"cell_type": "code", "execution_count": None, "id": f"cell-{i}", "metadata": {},
         "outputs": [], "source": source}
        for i, source in enumerate(sources)
    ]  # fmt: skip
    kernelspec = {"name": kernel[0], "display_name": kernel[1], "language": "python"}
    notebook = {"cells": cells, "metadata": {"kernelspec": kernelspec},
                "nbformat": 4, "nbformat_minor": 5}  # fmt: skip
    path.write_text(json.dumps(notebook, indent=1))


def test_artifacts_folder_is_ignored_by_git() -> None:
    """Screenshots are artefacts of a run, never committed."""
    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "test-artifacts/x.png"], cwd=root, check=False
    )
    assert ignored.returncode == 0
