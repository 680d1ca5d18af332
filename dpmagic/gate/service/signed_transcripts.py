"""Signed transcripts: what one user was released in one notebook, for grading offline.

An autograder that re-runs a student's notebook without network cannot reach
the gate, but it needs no new answer either: every answer the notebook asks
for was already released, and paid for, when the student ran it. A
transcript is that set of released answers, as the gate would replay them.
It holds nothing the user did not already see (the answers, their accuracy,
the public schema and budget), so handing it out leaks nothing.

It is signed with HMAC-SHA256 under a key kept in the gate's state directory,
so the instructor can check (``dpmagic transcript verify``) that a file a
student hands in is what the gate released, not numbers they edited.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from dpmagic.gate.ledger.scopes import RELEASED, REPLAYED
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.ledger.views import budget_views, history_entries
from dpmagic.gate.membership import declared_groups
from dpmagic.gate.policy import Policy

FORMAT = "dpmagic-transcript/1"
KEY_FILE = "transcript.key"
KEY_BYTES = 32
SIGNATURE_PREFIX = "hmac-sha256:"


class TranscriptError(ValueError):
    """A transcript that cannot be written or trusted; the message says why."""


def export(ledger: Ledger, policy: Policy, user: str, notebook: str) -> dict[str, object]:
    """The signed transcript of ``user``'s released answers in ``notebook``.

    Answers first released in another notebook and replayed in this one are
    included: the notebook's re-run will ask for them too. The latest release
    of a request wins, as it does when the gate replays.
    """
    answers: dict[str, dict[str, object]] = {}
    datasets: set[str] = set()
    rows = ledger.history(user=user, notebook=notebook, refusals=False)
    for entry in reversed(rows):
        if entry["status"] not in (RELEASED, REPLAYED):
            continue
        reply = ledger.reply(cast(int, entry["id"]))  # a row id, an integer in SQLite
        if reply is None or "request" not in reply:
            continue  # a release from before replies named their request
        request = {**reply["request"], "sql": entry["sql"], "dataset": entry["dataset"]}
        answer = {k: v for k, v in reply.items() if k not in ("budget", "request")}
        answers[_request_key(request)] = {"request": request, "reply": answer}
        datasets.add(str(entry["dataset"]))
    if not answers:
        raise TranscriptError(f"user {user} has no released answers in notebook {notebook!r}")
    document: dict[str, object] = {
        "format": FORMAT,
        "user": user,
        "notebook": notebook,
        "exported": datetime.now(UTC).isoformat(timespec="seconds"),
        "default_dataset": next(iter(policy.datasets)) if len(policy.datasets) == 1 else None,
        "datasets": {
            name: {
                **policy.datasets[name].as_dict(),
                "datasets": sorted(policy.datasets),
                "budget": budget_views(
                    ledger, user, policy.datasets[name], notebook, declared_groups(policy, user)
                ).json(),
            }
            for name in sorted(datasets)
        },
        "answers": list(answers.values()),
        # The notebook's history as `%dpbudget` shows it, at export.
        "history": history_entries(rows),
    }
    document["signature"] = sign(document, signing_key(policy.gate.state_dir))
    return document


def verify(document: object, key: bytes) -> dict[str, object]:
    """The document if its signature is the gate's, else ``TranscriptError``."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TranscriptError(f"not a {FORMAT} file")
    claimed = document.get("signature")
    if not isinstance(claimed, str) or not hmac.compare_digest(claimed, sign(document, key)):
        raise TranscriptError("the signature does not match: the file was changed or not ours")
    return document


def sign(document: dict[str, object], key: bytes) -> str:
    """HMAC over the canonical JSON of everything but the signature itself."""
    body = {k: v for k, v in document.items() if k != "signature"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return SIGNATURE_PREFIX + hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def signing_key(state_dir: Path) -> bytes:
    """The gate's transcript key, made on first use, readable by the gate's user only."""
    path = Path(state_dir) / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
    else:
        key = secrets.token_bytes(KEY_BYTES)
        with os.fdopen(fd, "wb") as out:
            out.write(key)
    if len(key) != KEY_BYTES:
        raise TranscriptError(f"{path} is not a transcript key; remove it to make a new one")
    return key


def _request_key(request: dict[str, object]) -> str:
    return json.dumps(request, sort_keys=True, default=str)
