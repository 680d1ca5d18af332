"""The supervisor of lab's and demo's children, with real processes: a stop
signal unwinds the command, and nothing it started survives."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from dpmagic.supervisor import Stopped, Supervisor

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
# A child that starts a grandchild in a session of its own, as jupyter_client
# starts kernels, says its pid, and leaves it behind when terminated.
SPAWNER = [
    sys.executable,
    "-c",
    "import subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
    " start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(120)",
]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)",
]


def test_a_signal_while_a_child_starts_waits_until_it_is_recorded() -> None:
    reached = False
    with pytest.raises(Stopped), Supervisor() as supervisor, supervisor._deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # delivered by now, and held
        reached = True
    assert reached
