"""A real headless Chromium (Debian's `chromium`, driven by Playwright's Python API) for the web
view's browser tests. Without one the tests skip with one line saying how to get one, unless
LEDGER_REQUIRE_BROWSER=1 (CI sets it after installing chromium): then they fail."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

HOW = "no Chromium for the browser tests: apt-get install -y chromium && pip install playwright"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing(why: str) -> None:
    if os.environ.get("LEDGER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"LEDGER_REQUIRE_BROWSER=1 and {why}", pytrace=False)
    pytest.skip(HOW)


@pytest.fixture(scope="module")
def chromium_executable() -> str:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        _missing("no chromium executable on PATH")
    return str(executable)


@pytest.fixture(scope="module")
def chromium(chromium_executable: str) -> Iterator[Any]:
    """One browser per module (a context per test keeps them apart). Not per session: Playwright's
    sync API keeps an event loop running in the main thread while it is started, and every later
    test that runs one of its own (anyio.run) would fail."""
    executable = chromium_executable
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A fresh page; every dialog it opens (alert, confirm) is recorded and dismissed."""
    context = chromium.new_context()
    opened = context.new_page()
    opened.dialogs = []  # type: ignore[attr-defined]

    def dismiss(dialog: Any) -> None:
        opened.dialogs.append(dialog.message)  # type: ignore[attr-defined]
        dialog.dismiss()

    opened.on("dialog", dismiss)
    opened.set_default_timeout(15_000)
    try:
        yield opened
    finally:
        context.close()
