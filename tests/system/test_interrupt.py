"""A slow query in a real kernel: progress is shown, Kernel ▸ Interrupt stops the
wait, the cell fails with one line, and the gate keeps the charge."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager

from dpmagic.client.http_gate import Gate
from tests.conftest import GateProcess, write_dataset
from tests.kernels import TIMEOUT, execute, kernel_env, running_kernel, shell_reply

# Every reply is held to the next multiple of this: a query that is slow for sure.
SLOW_MS = 6000
INTERRUPT_AFTER_S = 2.5
CELL = "%%dpsql -e 0.5\nSELECT COUNT(*) AS n FROM t\n"


@pytest.fixture
def slow_gate(tmp_path: Path, short_dir: Path) -> Iterator[GateProcess]:
    policy = write_dataset(tmp_path, f"response_quantum_ms = {SLOW_MS}\n")
    process = GateProcess(policy, f"unix:{short_dir / 'gate.sock'}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_interrupted_slow_query_fails_cleanly_and_stays_charged(slow_gate) -> None:
    manager = KernelManager(kernel_name="python3")
    env = kernel_env(DPMAGIC_GATE=slow_gate.address, JPY_SESSION_NAME="slow.ipynb")
    with running_kernel(manager, env) as kc:
        assert execute(kc, "%load_ext dpmagic").status == "ok"
        start = time.monotonic()
        msg_id = kc.execute(CELL)
        progress: list[str] = []
        interrupted_at = None
        while True:
            msg = kc.get_iopub_msg(timeout=TIMEOUT)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind in ("display_data", "update_display_data"):
                progress.append(content["data"]["text/plain"])
                if interrupted_at is None and time.monotonic() - start >= INTERRUPT_AFTER_S:
                    interrupted_at = time.monotonic()
                    manager.interrupt_kernel()
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = shell_reply(kc, msg_id)
        stopped = time.monotonic() - start

        assert interrupted_at is not None, "no progress was shown while waiting"
        assert progress[0].startswith("waiting for the gate… 1 s (Kernel ▸ Interrupt")
        assert reply["status"] == "error" and reply["ename"] == "UsageError"
        assert reply["evalue"].startswith("interrupted: stopped waiting for the gate after ")
        assert "stays charged" in reply["evalue"] and "\n" not in reply["evalue"]
        # The wait stopped at the interrupt, well before the gate's reply was due.
        assert stopped < SLOW_MS / 1000 - 1, stopped

        # The gate kept the charge.
        budget = Gate(slow_gate.address).budget(notebook="slow.ipynb")
        assert budget["notebook"]["spent"]["epsilon"] == pytest.approx(0.5)

        # Asked again, the released answer comes back at no cost.
        again = execute(kc, CELL)
        assert again.status == "ok"
        assert "replayed (no cost)" in again.text[-1]
        budget = Gate(slow_gate.address).budget(notebook="slow.ipynb")
        assert budget["notebook"]["spent"]["epsilon"] == pytest.approx(0.5)
