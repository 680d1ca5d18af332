"""Real Jupyter kernels through jupyter_client, as the end-to-end tests drive them: a
kernel started with a clean environment (``kernel_env``, ``running_kernel``), a cell
executed and what it sent back (``execute``, ``Outcome``, ``shell_reply``), and the
table and footer of a result's HTML (``table_of``, ``footer_of``). Shared by
tests/system/test_e2e_kernel.py, test_interrupt.py and test_grading.py."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

TIMEOUT = 60


@dataclass
class Outcome:
    """What one executed cell sent back."""

    status: str = ""
    html: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    streams: str = ""
    reply: dict = field(default_factory=dict)
    metadata: list[dict] = field(default_factory=list)


def execute(client: BlockingKernelClient, code: str) -> Outcome:
    msg_id = client.execute(code)
    outcome = Outcome()
    while True:
        msg = client.get_iopub_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind in ("execute_result", "display_data"):
            outcome.metadata.append(content.get("metadata", {}))
            outcome.html.append(content["data"].get("text/html", ""))
            outcome.text.append(content["data"].get("text/plain", ""))
        elif kind == "stream":
            outcome.streams += content["text"]
        elif kind == "status" and content["execution_state"] == "idle":
            break
    outcome.reply = shell_reply(client, msg_id)
    outcome.status = outcome.reply["status"]
    return outcome


def shell_reply(client: BlockingKernelClient, msg_id: str) -> dict:
    """The reply to ``msg_id``, skipping others (a late ``kernel_info_reply`` from
    ``wait_for_ready``, which may ask more than once while a kernel starts)."""
    while True:
        reply = client.get_shell_msg(timeout=TIMEOUT)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


def kernel_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPMAGIC_", "JPY_"))}
    env.update(extra)
    return env


@contextmanager
def running_kernel(manager: KernelManager, env: dict[str, str]) -> Iterator[BlockingKernelClient]:
    manager.start_kernel(env=env)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=TIMEOUT)
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def table_of(html: str) -> str:
    match = re.search(r"<table>.*</table>", html, re.DOTALL)
    assert match, html
    return match.group(0)


def footer_of(html: str) -> str:
    match = re.search(r'class="dpm-footer-text">(.*?)</span>', html)
    assert match, html
    return match.group(1)
