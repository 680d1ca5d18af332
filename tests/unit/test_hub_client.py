"""Which token the kernel side sends: the Hub's only over TCP, an explicit one first."""

from __future__ import annotations

import pytest

from dpmagic.client.http_gate import Gate


@pytest.fixture
def hub_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPMAGIC_TOKEN", raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-token-of-this-server")
    monkeypatch.setenv("JUPYTERHUB_USER", "someone-else")


def test_a_hub_kernel_sends_its_hub_token_over_tcp(hub_kernel: None) -> None:
    assert Gate("http://127.0.0.1:8765").token == "hub-token-of-this-server"


def test_a_unix_socket_gate_never_gets_the_hub_token(hub_kernel: None) -> None:
    assert Gate("unix:/run/dpmagic/gate.sock").token is None


def test_an_explicit_token_wins(hub_kernel: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Gate("http://127.0.0.1:8765", token="given").token == "given"
    monkeypatch.setenv("DPMAGIC_TOKEN", "from-the-environment")
    assert Gate("http://127.0.0.1:8765").token == "from-the-environment"
    monkeypatch.setenv("DPMAGIC_TOKEN", "")
    assert Gate("http://127.0.0.1:8765").token == "hub-token-of-this-server"
