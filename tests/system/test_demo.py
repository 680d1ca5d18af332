"""``dpmagic demo`` end to end: a real gate process, a real kernel, the real notebook."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.stopping import STOP_SIGNALS, Command, stop_and_check


def test_demo_runs_the_quickstart(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "dpmagic", "demo", "--patients", "500", "--keep", str(keep)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    code_cells = len(
        [c for c in nbformat.read(keep / "quickstart.ipynb", 4).cells if c.cell_type == "code"]
    )
    assert f"running cell {code_cells}/{code_cells}" in out
    assert "gate listening on unix:" in out
    # Noisy answers from several cells: the department and diagnosis keys are
    # public, so each appears in the printed results whatever the noise did.
    for key in ("pulmonology", "endocrinology", "respiratory infection", "back pain", "80+"):
        assert key in out.split("SELECT", 1)[1], key
    assert "refused:" in out
    # The explanations, whole, so a reader knows what each answer means.
    notebook = nbformat.read(keep / "quickstart.ipynb", 4)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            assert cell.source.strip() in out
    # Noisy values beside their intervals, e.g. "126 [0, 414]".
    assert len(re.findall(r"-?\d[\d.]* \[-?\d[\d.]*, -?\d[\d.]*\]", out)) >= 10
    assert "95% intervals beside each noisy value" in out
    # Kernels over IPC: no warning about unencrypted TCP.
    assert "TCP" not in out + done.stderr
    left = re.search(r"budget left: this notebook ε ([\d.]+) of 3; you overall ε [\d.]+ of 10", out)
    # More than half of the notebook's budget is left for a newcomer's own cells.
    assert left is not None and float(left.group(1)) >= 1.5
    # The plot cell is skipped in a terminal, not answered "plots need matplotlib".
    assert "skipping cell" in out and "%dpplot" in out
    assert "plots need matplotlib" not in out + done.stderr
    assert "gate stopped" in out
    # The executed notebook is kept, with outputs from the gate in it.
    executed = nbformat.read(keep / "quickstart.ipynb", 4)
    assert all(c.outputs for c in executed.cells if c.cell_type == "code" and "dpsql" in c.source)
    assert (keep / "state" / "ledger.sqlite3").exists()


def test_demo_removes_its_folder(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dpmagic", "demo", "--patients", "100"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    folder = re.search(r"in (\S+dpmagic-demo-\S+)", done.stdout)
    assert folder is not None
    assert not Path(folder.group(1)).exists()


@pytest.mark.signals
@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_demo_stops_everything_on_a_signal(tmp_path: Path, signum: int) -> None:
    """Mid-notebook: the kernel (in a session of its own) and the gate stop and
    the scratch folder with the data copy is removed."""
    demo = Command(["demo", "--patients", "100"], tmp_path / "demo.log")
    try:
        demo.wait_for(lambda: "running cell 3/" in demo.output(), "a running notebook")
        stop_and_check(demo, signum, demo.folder("dpmagic-demo-"), min_children=2)
    finally:
        if demo.proc.poll() is None:
            demo.kill("dpmagic-demo-")
