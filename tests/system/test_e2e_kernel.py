"""End to end: real Jupyter kernels, started by jupyter_client, against a real gate.

These follow a notebook's life: run cells, "Restart Kernel" and run them
again, restart the gate itself, and use the gated kernelspec that needs no
``%load_ext`` line.
"""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from dpmagic.kernel import install
from tests.kernels import (
    TIMEOUT,
    execute,
    footer_of,
    kernel_env,
    running_kernel,
    shell_reply,
    table_of,
)

CELL = "%%dpsql -e 0.5\nSELECT sex, COUNT(*) AS n, AVG(age) AS mean_age FROM t GROUP BY sex\n"


def test_notebook_life_across_kernel_and_gate_restarts(gate):
    manager = KernelManager(kernel_name="python3")
    env = kernel_env(DPMAGIC_GATE=gate.address, JPY_SESSION_NAME="course/hw1.ipynb")
    with running_kernel(manager, env) as kc:
        assert execute(kc, "%load_ext dpmagic").status == "ok"
        first = execute(kc, CELL)
        assert first.status == "ok", first.streams
        (html,) = first.html
        assert "<th>sex</th><th>n</th><th>mean_age</th>" in table_of(html)
        assert 'title="95% interval [' in html
        assert footer_of(html).startswith(
            "ε 0.5 spent · ε 1.5 left for the notebook, ε 4.5 left for the user"
        )
        assert "ε 4.5 left for the user" in first.text[0].splitlines()[-1]

        # A refused cell fails with one line, the gate's reason alone: no traceback, no
        # "UsageError:" before it (its error output's traceback is that line).
        refused = execute(kc, "%%dpsql -e 0.5\nSELECT pid FROM t\n")
        assert refused.status == "error"
        assert refused.reply["ename"] == "UsageError"
        assert refused.reply["evalue"].startswith("query refused: ")
        (line,) = refused.reply["traceback"]
        assert line == refused.reply["evalue"] and "\n" not in line
        assert refused.streams == ""

        # Restart Kernel, run again: the same numbers, at no cost.
        manager.restart_kernel(now=True)
        kc.wait_for_ready(timeout=TIMEOUT)
        assert execute(kc, "%load_ext dpmagic").status == "ok"
        (replayed,) = execute(kc, CELL).html
        assert table_of(replayed) == table_of(html)
        assert footer_of(replayed).startswith(
            "replayed (no cost) · ε 1.5 left for the notebook, ε 4.5 left for the user"
        )

        # Restart the gate on the same state: the ledger and the stored answer persist.
        gate.restart()
        (after_gate_restart,) = execute(kc, CELL).html
        assert table_of(after_gate_restart) == table_of(html)
        assert footer_of(after_gate_restart).startswith("replayed (no cost)")
        budget = execute(kc, "b = %dpbudget\nprint(b['d'].budget['user']['spent']['epsilon'])")
        assert budget.streams.strip() == "0.5"
        assert "notebook course/hw1.ipynb" in execute(kc, "%dpbudget").html[0]

        # The kernel holds the client only: no gate code, no DuckDB.
        forbidden = "('dpmagic.gate', 'duckdb')"
        loaded = execute(
            kc, f"import sys\nprint([m for m in sys.modules if m.startswith({forbidden})])"
        )
        assert loaded.streams.strip() == "[]"


def test_gated_kernelspec_needs_no_load_ext(gate, tmp_path: Path):
    spec_dir = Path(
        install(prefix=str(tmp_path / "prefix"), name="dpmagic-test", gate=gate.address)
    )
    assert spec_dir == tmp_path / "prefix" / "share" / "jupyter" / "kernels" / "dpmagic-test"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (dpmagic)"
    assert spec["argv"][1:] == ["-m", "dpmagic.kernel", "-f", "{connection_file}"]
    assert spec["env"] == {"DPMAGIC_GATE": gate.address}
    for logo in ("logo-32x32.png", "logo-64x64.png"):
        assert (spec_dir / logo).read_bytes().startswith(b"\x89PNG")

    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)])
    manager = KernelManager(kernel_name="dpmagic-test", kernel_spec_manager=specs)
    with running_kernel(manager, kernel_env()) as kc:
        outcome = execute(kc, CELL)
        assert outcome.status == "ok", outcome.streams
        assert footer_of(outcome.html[0]).startswith("ε 0.5 spent")
        assert execute(kc, "print(type(get_ipython()).__name__)").streams.strip() == (
            "ZMQInteractiveShell"
        )
        # A notebook written for any kernel (the quickstart) loads the magics itself:
        # here that is silent, not "already loaded … %reload_ext", and they still work.
        loaded = execute(kc, "%load_ext dpmagic")
        assert loaded.status == "ok" and loaded.streams == "", loaded.streams
        again = execute(kc, CELL)
        assert again.status == "ok" and "replayed" in footer_of(again.html[0])


def complete(client: BlockingKernelClient, code: str) -> list[str]:
    """A front end's ``complete_request`` at the end of ``code``: the matches offered."""
    msg_id = client.complete(code, len(code))
    return shell_reply(client, msg_id)["matches"]


def test_a_kernel_completes_sql_and_publishes_the_notebooks_budget(gate, tmp_path: Path):
    """What every front end gets from the kernel: SQL completion in %%dpsql cells, and
    each answer's metadata with the notebook's ε left (JupyterLab's status bar)."""
    manager = KernelManager(kernel_name="python3")
    env = kernel_env(DPMAGIC_GATE=gate.address, JPY_SESSION_NAME="hw2.ipynb")
    with running_kernel(manager, env) as kc:
        assert execute(kc, "%load_ext dpmagic").status == "ok"
        after_select = complete(kc, "%%dpsql\nSELECT a")
        assert {"age", "abs", "and", "avg"} <= set(after_select)
        assert complete(kc, "%%dpsql\nSELECT COUNT(*) FROM ") == ["t"]
        assert "--dry-run" in complete(kc, "%%dpsql --")
        outcome = execute(kc, CELL)
        assert outcome.status == "ok", outcome.streams
        assert outcome.metadata == [
            {"dpmagic": {"notebook": "hw2.ipynb", "dataset": "d", "epsilon_left": 1.5,
                         "epsilon_limit": 2.0}}
        ]  # fmt: skip
        # A mock run keeps the gate's figure: it publishes none and is charged nothing.
        mock = execute(kc, "%%dpsql --mock\nSELECT sex, COUNT(*) AS n FROM t GROUP BY sex")
        assert mock.status == "ok" and mock.metadata == [{}]
        assert "mock data — not the real dataset" in mock.html[0]
