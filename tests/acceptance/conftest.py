"""Fixtures of the inbox UI's browser tests: one Chromium per test module, and a fresh page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from tests.acceptance.inbox_ui_support import launch_chromium, new_page


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium, shared by the tests of a module."""
    with launch_chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page in a browser context of its own (its own cookies)."""
    with new_page(browser) as opened:
        yield opened
