"""The supervisor of lab's and demo's children, with real processes: a stop signal unwinds
the command, and nothing it started survives.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_supervisor.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dpmagic.commands.supervisor import STOP_SIGNALS, Stopped, Supervisor

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


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_a_stop_signal_unwinds_and_stops_every_child(signum: int) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(Stopped) as stopped, Supervisor(grace=1) as supervisor:
        first = supervisor.popen(SLEEP)
        spawner = supervisor.popen(SPAWNER, stdout=subprocess.PIPE, text=True)
        assert spawner.stdout is not None
        grandchild = int(spawner.stdout.readline())
        # One group for the children, not ours: a terminal's Ctrl-C reaches
        # only the command; the grandchild has a session of its own.
        assert os.getpgid(first.pid) == os.getpgid(spawner.pid) == first.pid
        assert first.pid != os.getpgid(0)
        assert os.getpgid(grandchild) == grandchild
        os.kill(os.getpid(), signum)
        time.sleep(30)  # never reached: the handler raises at once
    assert stopped.value.signum == signum
    assert first.poll() is not None and spawner.poll() is not None
    assert _gone(grandchild)
    assert signal.getsignal(signum) == before


def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    grace = 1.0
    with Supervisor(grace=grace) as supervisor:
        stubborn = supervisor.popen(STUBBORN, stdout=subprocess.PIPE, text=True)
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        began = time.monotonic()
    assert time.monotonic() - began >= grace
    assert stubborn.wait(5) == -signal.SIGKILL


def test_signals_during_the_cleanup_do_not_interrupt_it() -> None:
    with Supervisor(grace=5) as supervisor:
        child = supervisor.popen(SLEEP)
        supervisor.stop()
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: already stopping
        time.sleep(0.2)
    assert child.poll() is not None


def test_an_exception_stops_the_children_too() -> None:
    with pytest.raises(RuntimeError, match="a bug"), Supervisor(grace=5) as supervisor:
        child = supervisor.popen(SLEEP)
        raise RuntimeError("a bug")
    assert child.poll() == -signal.SIGTERM
