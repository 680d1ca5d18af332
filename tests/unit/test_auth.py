"""Identity: peer credentials on real unix sockets, bearer tokens from a file."""

from __future__ import annotations

import os
import pwd
import socket
import tempfile
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

import pytest

from dpmagic.gate.failures import Unauthorized
from dpmagic.gate.service.auth import PeerCredAuth, TokenAuth, TokenFileError, load_tokens

ALICE_TOKEN = "alice-0123456789abcdef"
BOB_TOKEN = "bob-fedcba9876543210"


@dataclass
class Incoming:
    """What a request handler exposes to an authenticator: its socket and headers."""

    connection: socket.socket
    headers: Message = field(default_factory=Message)


def headers(**values: str) -> Message:
    message = Message()
    for name, value in values.items():
        message[name] = value
    return message


def me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def test_peer_credentials_over_a_socketpair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert PeerCredAuth().identify(Incoming(a)) == me()


def test_peer_credentials_over_a_listening_unix_socket() -> None:
    with tempfile.TemporaryDirectory(prefix="dpm-") as folder:
        path = str(Path(folder) / "s.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            server.listen(1)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(path)
                accepted, _ = server.accept()
                with accepted:
                    # A header claiming another identity changes nothing.
                    claim = headers(Authorization=f"Bearer {ALICE_TOKEN}", X_User="root")
                    assert PeerCredAuth().identify(Incoming(accepted, claim)) == me()


def test_peer_credentials_refuse_tcp() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp, pytest.raises(Unauthorized):
        PeerCredAuth().identify(Incoming(tcp))


def write_tokens(folder: Path, text: str) -> Path:
    path = folder / "tokens.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture
def token_auth(tmp_path: Path) -> TokenAuth:
    path = write_tokens(tmp_path, f'[users]\nalice = "{ALICE_TOKEN}"\nbob = "{BOB_TOKEN}"\n')
    return TokenAuth.from_file(path)


def identify(auth: TokenAuth, message: Message) -> str:
    a, b = socket.socketpair()
    with a, b:
        return auth.identify(Incoming(a, message))


def test_a_good_token_names_its_user(token_auth: TokenAuth) -> None:
    assert identify(token_auth, headers(Authorization=f"Bearer {ALICE_TOKEN}")) == "alice"
    assert identify(token_auth, headers(Authorization=f"bearer  {BOB_TOKEN} ")) == "bob"


@pytest.mark.parametrize(
    "value",
    [
        "Bearer wrong-token-0123456789",
        f"Bearer {ALICE_TOKEN}x",
        f"Bearer {ALICE_TOKEN[:-1]}",
        f"Basic {ALICE_TOKEN}",
        "Bearer ",
        ALICE_TOKEN,
    ],
)
def test_bad_tokens_are_refused(token_auth: TokenAuth, value: str) -> None:
    with pytest.raises(Unauthorized) as refused:
        identify(token_auth, headers(Authorization=value))
    assert refused.value.kind == "auth" and refused.value.status == 401


def test_a_missing_header_is_refused(token_auth: TokenAuth) -> None:
    with pytest.raises(Unauthorized, match="Authorization: Bearer"):
        identify(token_auth, headers())


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[users\n", "not valid TOML"),
        ("", r"declare tokens under \[users\]"),
        ("[users]\n", r"declare tokens under \[users\]"),
        ('users = "x"\n', r"declare tokens under \[users\]"),
        ('[users]\nalice = "short"\n', "shorter than 16 characters"),
        ("[users]\nalice = 1234567890123456789\n", "must be a string"),
        (f'[users]\nalice = "{ALICE_TOKEN}"\nbob = "{ALICE_TOKEN}"\n', "share the token"),
    ],
)
def test_malformed_token_files_are_rejected_at_load(
    tmp_path: Path, text: str, complaint: str
) -> None:
    with pytest.raises(TokenFileError, match=complaint):
        TokenAuth.from_file(write_tokens(tmp_path, text))


def test_a_missing_token_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="tokens file not found"):
        load_tokens(tmp_path / "nope.toml")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666])
def test_a_tokens_file_others_can_reach_is_refused(tmp_path: Path, mode: int) -> None:
    """As ssh does with a private key: anyone who reads the file is every user in it."""
    path = write_tokens(tmp_path, f'[users]\nalice = "{ALICE_TOKEN}"\n')
    path.chmod(mode)
    with pytest.raises(TokenFileError, match=rf"mode {mode:04o}.*`chmod 600 {path}`"):
        load_tokens(path)
    path.chmod(0o600)
    assert load_tokens(path) == {"alice": ALICE_TOKEN}
    path.chmod(0o400)  # read-only for its owner is fine too
    assert load_tokens(path) == {"alice": ALICE_TOKEN}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_tokens_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = write_tokens(tmp_path, f'[users]\nalice = "{ALICE_TOKEN}"\n')
    os.chown(path, 65534, -1)
    with pytest.raises(TokenFileError, match=r"belongs to uid 65534.*chown"):
        load_tokens(path)
