"""Start a real ``dpmagic`` command, signal it, and check it left nothing behind.

Shared by the ``lab`` and ``demo`` stop tests: what "nothing behind" means is
the same for both: the command ended by the signal it was sent, every process
it had started (recorded before the signal: its descendants, and anything in
their process groups, kernels' own groups included) is gone, and its temporary
folder with the copy of the data is removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

STOP_SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


class Command:
    """``python -m dpmagic ARGS`` with its output in a file (no pipe to fill)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dpmagic", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            assert self.proc.poll() is None, f"exited before {what}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {what} in time:\n{self.output()}"
            time.sleep(0.3)

    def folder(self, prefix: str) -> Path:
        """The temporary folder the command announced it works in."""
        found = re.search(rf"in (\S*{prefix}\S*)", self.output())
        assert found, self.output()
        return Path(found.group(1))

    def kill(self, folder_prefix: str) -> None:
        """Last resort in a failing test: nothing may outlive it, not even the
        folder a SIGKILLed command cannot remove."""
        for proc in [*_descendants(self.proc.pid), psutil.Process(self.proc.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.proc.wait()
        found = re.search(rf"in (\S*{folder_prefix}\S*)", self.output())
        if found:
            shutil.rmtree(found.group(1), ignore_errors=True)


def stop_and_check(command: Command, signum: int, folder: Path, min_children: int) -> None:
    """Send ``signum`` and assert the command cleaned up everything it made."""
    children = _descendants(command.proc.pid)
    assert len(children) >= min_children, [c.cmdline() for c in children]
    # A short-lived child (JupyterLab runs helpers now and then) may end
    # between the listing and this look-up: it has no group left to check.
    groups = {_group(c) for c in children} - {os.getpgid(0), None}
    assert folder.is_dir()
    command.proc.send_signal(signum)
    try:
        code = command.proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        command.kill(folder.name.rsplit("-", 1)[0])
        raise AssertionError(f"still running {STOP_TIMEOUT_S:.0f}s after the signal") from None
    # Ended by the signal it was sent, after its cleanup (not killed by it
    # unhandled: then the message below would be missing).
    assert code == -signum, command.output()[-3000:]
    assert f"dpmagic: {signal.Signals(signum).name}: stopped everything" in command.output()
    left = [c for c in children if _alive(c)]
    assert not left, [c.cmdline() for c in left]
    in_groups = [p for p in psutil.process_iter() if _alive(p) and _group(p) in groups]
    assert not in_groups, [p.cmdline() for p in in_groups]
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _alive(proc: psutil.Process) -> bool:
    """Running, and not a zombie (a zombie is dead; its parent may be an init
    that does not reap)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None
