"""JupyterLab in a real browser: ``dpmagic lab`` driven by Chromium through Playwright.

A user's view, end to end: the gate on the clinic example, JupyterLab with
the gated kernel, the quickstart opened and run from the Run menu, then a
refused ``%%dpsql`` cell typed in and run. What the user would see is
asserted in the page (tables, the interval toggle, the budget footer and its
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

from dpmagic.demo import NOTEBOOK, example_file

pytestmark = pytest.mark.browser
pytest.importorskip("jupyterlab", reason="JupyterLab is the optional extra dpmagic[lab]")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright's Python client: pip install 'dpmagic[browser]'"
)
CHROMIUM = "/usr/bin/chromium"
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(
        "Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True
    )

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
TOKEN = "dpmagic-browser-test-token"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
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

    # Departments: every public key is a row; intervals open from the toggle.
    departments = results.nth(_index(cells, "GROUP BY department\nORDER BY"))
    departments.scroll_into_view_if_needed()
    assert departments.locator("tbody tr").count() == 10
    interval = departments.locator(".dpm-int").first
    assert not interval.is_visible()
    assert (
        departments.locator("td.dpm-noisy")
        .first.get_attribute("title")
        .startswith("95% interval [")
    )
    departments.locator("details.dpm-toggle > summary").click()
    interval.wait_for(state="visible")
    assert interval.inner_text().startswith("[")
    _shoot(page, "lab-result-light.png")

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
    assert "UsageError" in error.inner_text()
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
    shown, the notebook's ε left in the status bar."""
    config = page.evaluate(
        "() => JSON.parse(document.getElementById('jupyter-config-data').textContent)"
    )
    assert "dpmagic-jupyterlab" in [e["name"] for e in config["federated_extensions"]]
    status = page.locator(".dpmagic-budget-status")
    assert re.fullmatch(r"ε left: [\d.]+ of 3", status.inner_text()), status.inner_text()

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


def test_artifacts_folder_is_ignored_by_git() -> None:
    """Screenshots are artefacts of a run, never committed."""
    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "test-artifacts/x.png"], cwd=root, check=False
    )
    assert ignored.returncode == 0
