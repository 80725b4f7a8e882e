"""Debian's chromium, headless, driven by Playwright: how the browser tests open a page."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
TIMEOUT_MS = 60_000  # a loaded machine starves the browser and the servers it reads alike


def require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Debian's chromium is required at {CHROMIUM} (.ci/run installs it)")


@contextmanager
def page(width: int, height: int) -> Iterator[Page]:
    """A fresh page of that viewport, every wait on it bounded by ``TIMEOUT_MS``; the browser
    closes when the block ends, however it ends."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            opened = browser.new_page(viewport={"width": width, "height": height})
            opened.set_default_timeout(TIMEOUT_MS)
            yield opened
        finally:
            browser.close()
