"""Debian's Chromium driven by Playwright's Python client, as every browser test
launches it: Playwright's own browser download is never used. ``playwright_api()``
skips the calling test module where either is missing."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# Screenshots, kept for a person to look at (ignored by git).
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def playwright_api() -> ModuleType:
    """``playwright.sync_api``; the calling module is skipped without it or without
    Debian's chromium (``.ci/run`` installs both)."""
    api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright's Python client: pip install 'dpmagic[browser]'"
    )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            "Debian's chromium is not installed (apt-get install chromium)",
            allow_module_level=True,
        )
    return api
