"""A gate of several worker processes behind one address (``gate.workers``).

A query's analysis is pure Python and holds the interpreter's lock, so one gate
process answers new texts on one core whatever the machine has. With ``workers =
N`` this process binds the address (so a second gate on it stops before touching
the state directory, as a single process does), then starts N workers, fresh
interpreters (``python -m dpmagic.gate.service.workers``) that inherit the bound
sockets; each builds its own engine (its DuckDB over the same prepared file,
attached read-only, and its own connection to the same ledger) and accepts
connections from the shared sockets, whichever is free first. They are started
fresh rather than forked because this process has imported DuckDB, Arrow and
NumPy, whose threads a fork would copy in the middle of whatever they held.

What must hold for a user across workers, and how it does (docs/architecture.md,
"Worker processes"):

- every charge is the ledger's: one SQLite file, each debit one ``BEGIN
  IMMEDIATE`` transaction, so workers never overspend a budget between them;
- a user's one run per dataset (``admission.py``) is held across processes by a
  lock per user the kernel keeps (``engines/run_locks.py``);
- the same question asked at once makes one release: its first release's leader
  holds a lock per scope it is served in (``run_locks.FlightLocks``);
- a resource failure is counted in the ledger (``Engine._within_failures``), so the
  daily cap counts every worker's;
- the rest is each worker's own and decides no charge: the analysis cache and
  replay hints (a miss costs an analysis, the ledger still decides what is served),
  the per-user connection and request limits (each worker's, so a user may hold N
  times as many across the gate), the padding clock.

The workers start in turn (the first prepares the data while the others wait for
its lock, ``prepared.py``); the address is announced (``LISTENING``) once every one
says it is ready. A worker that dies is replaced; SIGTERM or SIGINT stops them all,
each finishing the requests it is answering. Each worker reads its end of a pipe
this process holds (its standard input): if this process dies, however, they stop.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dpmagic.gate.policy import Policy, PolicyError, check_workers, load_policy
from dpmagic.gate.service.auth import HubConfigError, TokenFileError
from dpmagic.gate.service.listen import Listener, ListenError, private_dir
from dpmagic.gate.service.process import (
    LISTENING,
    USAGE_ERROR,
    authenticator,
    bind,
    gate_over,
    serve_until_signalled,
    setup_logging,
    tune_collector,
)

log = logging.getLogger("dpmagic.gate")

READY = "ready"
# A worker's start can prepare a dataset (seconds to minutes for 10M rows).
READY_TIMEOUT_S = 3600.0
# How long stopping waits for a worker to finish its requests, then kills it.
STOP_GRACE_S = 60.0
POLL_S = 0.2
START_ERRORS = (ListenError, TokenFileError, HubConfigError, PolicyError, OSError)


@dataclass
class Worker:
    """One worker process and its number."""

    index: int
    proc: subprocess.Popen[str]


def supervise(policy: Policy, listen: str, jupyterhub: bool, workers: int) -> int:
    """Bind ``listen``, start ``workers`` workers over it and serve until SIGTERM or
    SIGINT; 0 after a clean stop, ``USAGE_ERROR`` if the gate could not start."""
    try:
        check_workers(workers, policy.datasets.values())
        authenticator(policy, listen, jupyterhub)  # a missing tokens file: said here, once
        listener = bind(listen)
    except START_ERRORS as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _SIGNALS}
    running: list[Worker] = []
    try:
        private_dir(policy.gate.state_dir)
        # The first alone: it prepares the data, and a policy that cannot start fails
        # once; then the others together.
        running.append(_start(0, policy, listener, jupyterhub))
        if not _ready(running[0], stop):
            return USAGE_ERROR
        running += [_start(i, policy, listener, jupyterhub) for i in range(1, workers)]
        if not all([_ready(worker, stop) for worker in running[1:]]):
            return USAGE_ERROR
        print(f"{LISTENING} {listener.address}", flush=True)
        _watch(running, policy, listener, jupyterhub, stop)
        return 0
    except OSError as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        _stop(running)
        listener.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _start(index: int, policy: Policy, listener: Listener, jupyterhub: bool) -> Worker:
    fds = [s.fileno() for s in listener.sockets]
    command = [
        sys.executable, "-m", "dpmagic.gate.service.workers",
        "--policy", str(policy.path), "--address", listener.address,
        "--fds", ",".join(map(str, fds)), "--index", str(index),
    ]  # fmt: skip
    if jupyterhub:
        command.append("--jupyterhub")
    # stdin: the lifeline (never written); stdout: its ready line; stderr: the log.
    proc = subprocess.Popen(
        command, pass_fds=fds, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return Worker(index, proc)


def _ready(worker: Worker, stop: threading.Event) -> bool:
    """Whether ``worker`` said it is ready; False if it exited first (its error is on
    the shared stderr), or a signal came while it started."""
    out = _stdout(worker)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not stop.is_set() and time.monotonic() < deadline:
        ready, _, _ = select.select([out], [], [], POLL_S)
        if ready:
            return out.readline().strip() == READY
    return False


def _watch(
    running: list[Worker],
    policy: Policy,
    listener: Listener,
    jupyterhub: bool,
    stop: threading.Event,
) -> None:
    """Until ``stop``: replace a worker that exited; give up if its replacement cannot
    start (the data or the policy is gone: the service manager sees the exit)."""
    while not stop.wait(POLL_S):
        for slot, worker in enumerate(running):
            code = worker.proc.poll()
            if code is None:
                continue
            log.error("worker %d %s; starting another", worker.index, _exit_status(code))
            _close_pipes(worker)
            running[slot] = _start(worker.index, policy, listener, jupyterhub)
            if not _ready(running[slot], stop) and not stop.is_set():
                raise OSError(f"worker {worker.index} exited and could not be started again")


def _exit_status(code: int) -> str:
    """How a worker ended, as the log says it: a signal by its name (``SIGSEGV``: a
    crash in native code, whose stacks the worker wrote to the log just before), else
    its exit status."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited ({code})"


def _stop(running: list[Worker]) -> None:
    """SIGTERM to every worker, then wait for each to finish its requests."""
    for worker in running:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in running:
        try:
            worker.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("worker %d did not stop in %.0f s; killed", worker.index, STOP_GRACE_S)
            worker.proc.kill()
            worker.proc.wait()
        _close_pipes(worker)


def _stdout(worker: Worker) -> IO[str]:
    out = worker.proc.stdout
    if out is None:  # Popen was given stdout=PIPE
        raise OSError("a worker without its pipe")
    return out


def _close_pipes(worker: Worker) -> None:
    for pipe in (worker.proc.stdin, worker.proc.stdout):
        if pipe is not None:
            pipe.close()


def work(argv: Sequence[str] | None = None) -> int:
    """A worker: the engine over the inherited sockets, until SIGTERM, SIGINT or its
    supervisor's end of the lifeline closes."""
    parser = argparse.ArgumentParser(prog="python -m dpmagic.gate.service.workers")
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--fds", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--jupyterhub", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(f"dpmagic gate worker {args.index}")
    sockets = [socket.socket(fileno=int(fd)) for fd in args.fds.split(",")]
    listener = Listener(sockets, args.address)  # closing it closes our copies only
    try:
        policy = load_policy(args.policy)
        auth = authenticator(policy, args.address, args.jupyterhub)
        gate = gate_over(listener, policy, auth, shared=True)
    except START_ERRORS as exc:
        listener.close()
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    tune_collector()
    print(READY, flush=True)
    # Nothing reads the pipe after this line: whatever else is printed goes to the log,
    # not into a pipe whose full buffer would stop the worker.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        asyncio.run(serve_until_signalled(gate, lifeline=sys.stdin.fileno()))
    finally:
        gate.close()
    return 0


if __name__ == "__main__":
    sys.exit(work())
