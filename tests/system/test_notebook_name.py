"""``jupyter execute --output out.ipynb in.ipynb`` charges the notebook it runs,
``in.ipynb``, as the user guide says, not the file it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

from dpmagic.client.http_gate import Gate
from dpmagic.commands.demo import GateProcess, prepare_example


def test_jupyter_execute_with_an_output_charges_the_input(tmp_path: Path, short_dir: Path):
    policy = prepare_example(tmp_path / "clinic", patients=200)
    work = tmp_path / "work"
    work.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("%load_ext dpmagic"),
        nbformat.v4.new_code_cell("%%dpsql -e 0.1\nSELECT COUNT(*) AS n FROM visits"),
    ]
    nbformat.write(notebook, work / "in.ipynb")
    gate = GateProcess(policy, short_dir / "name.sock", tmp_path / "gate.log")
    gate.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DPMAGIC_", "JPY_"))}
        env.update(HOME=str(tmp_path), DPMAGIC_GATE=gate.address)
        execute = Path(sys.executable).parent / "jupyter-execute"
        done = subprocess.run(
            [str(execute), "--output", "out.ipynb", "in.ipynb"],
            cwd=work, env=env, timeout=300, capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert (work / "out.ipynb").exists()
        budget = Gate(gate.address).budget
        assert budget(notebook="in.ipynb")["notebook"]["spent"]["epsilon"] == 0.1
        assert budget(notebook="out.ipynb")["notebook"]["spent"]["epsilon"] == 0.0
    finally:
        gate.stop()
