"""``dpmagic console``'s process: the console served on its address until SIGTERM or
SIGINT, signed in by the Unix user's login URL, admin tokens, or, under
``--jupyterhub``, as a Hub service (``hub.py``). Apart from ``server.py``, which the
Hub's handlers build on, so that neither imports the other back."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from dpmagic.gate import owner
from dpmagic.gate.console.hosts import Hosts
from dpmagic.gate.console.owners import AdminTokens, Owner, Way
from dpmagic.gate.console.server import Console, application
from dpmagic.gate.policy import Policy


def run(
    policy: Policy,
    host: str,
    port: int,
    admin_tokens: Path | None,
    jupyterhub: bool,
    public: Sequence[str] = (),
) -> int:
    """Serve the console until SIGTERM or SIGINT, then exit 0. ``public``: URLs it is
    reached at besides its own address (behind a TLS proxy that keeps the browser's
    ``Host``), the only other names it answers (``hosts.py``)."""
    admins = AdminTokens.from_file(admin_tokens) if admin_tokens is not None else None
    ledger = policy.gate.state_dir / owner.LEDGER_FILE  # another user's: refused
    owner.check_owner(ledger if ledger.exists() else policy.gate.state_dir)
    logging.basicConfig(level=logging.INFO, format="dpmagic console: %(message)s")
    if jupyterhub:
        from dpmagic.gate.console.hub import hub_console

        console, app, host, port = hub_console(policy, admins)
    else:
        console = Console(
            policy, "/", admins, Owner(owner.operator(), Way.UNIX), public=tuple(public)
        )
        app = application(console)
    return asyncio.run(_serve(console, app, host, port, jupyterhub))


async def _serve(console: Console, app: Application, host: str, port: int, hub: bool) -> int:
    sockets = bind_sockets(port, host)
    bound = sockets[0].getsockname()[1]
    addresses = [s.getsockname()[0] for s in sockets]
    console.hosts = Hosts.served(host, addresses, bound, console.public, behind_hub=hub)
    server = HTTPServer(app, xheaders=hub)  # behind the Hub's proxy: its forwarded scheme
    server.add_sockets(sockets)
    where = f"http://{host if ':' not in host else f'[{host}]'}:{bound}{console.base}"
    if console.unix is not None:
        token = console.sessions.login_token()
        print(f"dpmagic console: open {where}login?token={token} (it signs in one browser, once)")
    else:
        print(f"dpmagic console: serving {where} to the Hub's admins")
    if not hub and not ipaddress.ip_address(sockets[0].getsockname()[0]).is_loopback:
        print(
            "dpmagic console: warning: served over plain HTTP beyond this machine; "
            "put it behind TLS, or keep --host on 127.0.0.1 and tunnel (ssh -L)"
        )
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        server.stop()
        console.close()
    return 0
