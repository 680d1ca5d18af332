"""The gate's command: ``dpmagic serve`` and ``python -m dpmagic.gate.service.server``.

It serves the policy's datasets as one process (``process.py``: the HTTP/JSON API and
the rules the privacy model rests on) or, with ``gate.workers`` above one, binds the
address and supervises that many worker processes (``workers.py``), each of which
runs ``process.py`` itself. This module only chooses between the two, so neither
imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from dpmagic.gate.policy import Policy, PolicyError, load_policy
from dpmagic.gate.service.auth import HubConfigError, TokenFileError
from dpmagic.gate.service.listen import ListenError, hub_listen
from dpmagic.gate.service.process import (
    LISTENING,
    USAGE_ERROR,
    open_gate,
    serve_until_signalled,
    setup_logging,
    tune_collector,
)
from dpmagic.gate.service.workers import supervise


def serve(
    policy: Policy,
    listen: str | None = None,
    jupyterhub: bool = False,
    workers: int | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT, then finish requests in flight and exit 0.

    Prints exactly one line, ``dpmagic gate listening on ADDRESS``, once the
    socket accepts connections, so a supervisor can wait for it. With more than one
    worker (``workers``, else the policy's ``gate.workers``) this process binds the
    address and supervises that many worker processes (``workers.py``).
    """
    setup_logging()
    count = policy.gate.workers if workers is None else workers
    try:
        if jupyterhub and listen is None:
            listen = hub_listen()
        if count > 1:
            return supervise(policy, listen or policy.gate.listen, jupyterhub, count)
        gate = open_gate(policy, listen or policy.gate.listen, jupyterhub=jupyterhub)
    except (ListenError, TokenFileError, HubConfigError, PolicyError, OSError) as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    tune_collector()
    print(f"{LISTENING} {gate.address}", flush=True)
    try:
        asyncio.run(serve_until_signalled(gate))
    finally:
        # After the last reply: the engine (and its ledger) closes last.
        gate.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpmagic.gate.service.server", description="Run the dpmagic gate."
    )
    parser.add_argument("--policy", type=Path, required=True, help="the policy TOML file")
    parser.add_argument("--listen", help="unix:PATH or tcp:HOST:PORT (default: gate.listen)")
    parser.add_argument(
        "--jupyterhub", action="store_true", help="run as a JupyterHub service (Hub API tokens)"
    )
    parser.add_argument("--workers", type=int, help="worker processes (default: gate.workers, 1)")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    return serve(policy, args.listen, jupyterhub=args.jupyterhub, workers=args.workers)


if __name__ == "__main__":
    sys.exit(main())
