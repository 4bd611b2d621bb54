"""Real browsers against real processes for the inbox UI's acceptance tests.

A :class:`Stack` is a fresh PostgreSQL database with a ``turnstile serve`` process (the
banking example, bearer tokens of :mod:`tests.acceptance.inbox_ui_auth`, approvers by role)
and one ``turnstile worker`` process; the browser is Debian's Chromium driven by Playwright
(Playwright's own browser download is not used). Screenshots go to ``tests/artifacts/``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from examples.banking import read_ledger
from tests.acceptance.inbox_ui_auth import TOKENS
from tests.databases import postgres_url
from tests.http_support import ROOT, serve_process, worker_process

__all__ = [
    "ARTIFACTS",
    "CHROMIUM",
    "Stack",
    "eventually",
    "evidence",
    "launch_chromium",
    "open_stack",
    "screenshot",
    "sign_in",
]

#: Debian's Chromium (``apt-get install chromium``; ``.ci/run`` installs it when missing).
CHROMIUM = os.environ.get("TURNSTILE_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "tests" / "artifacts" / "inbox-ui"
AUTH_SPEC = "tests.acceptance.inbox_ui_auth:auth"

T = TypeVar("T")


def eventually(check: Callable[[], T | None], *, timeout: float, what: str) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def launch_chromium() -> Iterator[Browser]:
    """Headless Chromium (the Debian package), or a skip naming the package to install —
    except in CI, where a missing browser is a failure."""
    if shutil.which(CHROMIUM) is None:
        message = f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    playwright: Playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page screenshot to the test artifacts."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@contextlib.contextmanager
def evidence(page: Page, name: str) -> Iterator[None]:
    """On a failure inside the block, keep the page as it was (screenshot and HTML)."""
    try:
        yield
    except BaseException:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            page.screenshot(path=str(ARTIFACTS / f"FAILED-{name}.png"), full_page=True)
            (ARTIFACTS / f"FAILED-{name}.html").write_text(page.content())
        raise


def sign_in(page: Page, base: str, who: str, *, start: str = "/ui") -> None:
    """Sign ``who`` in through the login form (from ``start``, which sends the browser to
    it), and wait for the page it leads back to."""
    page.goto(f"{base}{start}")
    page.wait_for_url("**/ui/login**")
    page.get_by_label("Token").fill(TOKENS[who])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector(f"text=Signed in as {who}")


@dataclass
class Stack:
    """A database, a ``turnstile serve`` and a ``turnstile worker`` on it."""

    base: str
    db_url: str
    ledger: Path
    env: dict[str, str]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def api(self, who: str) -> httpx.Client:
        """An HTTP client of the JSON API with ``who``'s bearer token."""
        return httpx.Client(
            base_url=self.base,
            headers={"Authorization": f"Bearer {TOKENS[who]}"},
            timeout=30,
        )

    def ask(self, text: str, *, who: str = "alice") -> str:
        """Start a turn of the banking agent as ``who`` (detached); its snapshot id."""
        body = {"data": {"message": {"role": "user", "content": [{"text": text}]}, "detach": True}}
        with self.api(who) as client:
            answer = client.post("/api/bankingAgent", json=body)
        answer.raise_for_status()
        return str(answer.json()["result"]["snapshotId"])

    def approval(self, turn_id: str, *, who: str = "bob") -> dict[str, Any] | None:
        """The inbox entry of the turn's first approval (JSON API), or ``None``."""
        with self.api(who) as client:
            found = client.get("/inbox", params={"agent": "bankingAgent"})
        found.raise_for_status()
        items = [i for i in found.json()["items"] if i["turnId"] == turn_id]
        return items[0] if items else None

    def wait_for_approval(self, turn_id: str) -> dict[str, Any]:
        """The approval once the worker paused the turn at it."""
        return eventually(
            lambda: self.approval(turn_id), timeout=30, what=f"an approval of {turn_id}"
        )

    def snapshot(self, snapshot_id: str, *, who: str = "alice") -> dict[str, Any]:
        """``getSnapshot`` of a turn."""
        with self.api(who) as client:
            got = client.post(
                "/api/bankingAgent/getSnapshot", json={"data": {"snapshotId": snapshot_id}}
            )
        got.raise_for_status()
        return dict(got.json()["result"])

    def transfers(self) -> list[dict[str, Any]]:
        """What the workers booked in the ledger (once per idempotency key)."""
        return read_ledger(self.ledger)


@contextlib.contextmanager
def open_stack(tmp_path: Path, *, env: dict[str, str] | None = None) -> Iterator[Stack]:
    """A fresh database with a server (``--auth``, approvers by role) and a worker."""
    ledger = tmp_path / "ledger.jsonl"
    settings = {
        "TURNSTILE_LEDGER": str(ledger),
        "TURNSTILE_UI_POLL_SECONDS": "0.5",
        "TURNSTILE_UI_SECRET": "inbox-ui-acceptance-secret-0123456789abcdef",
        **(env or {}),
    }
    args = ["--auth", AUTH_SPEC, "--inbox-policy", "role:approver"]
    with (
        postgres_url() as url,
        serve_process(url, args=args, env=settings, log=tmp_path / "serve.log") as (base, _p),
        worker_process(url, env=settings) as worker,
    ):
        yield Stack(base=base, db_url=url, ledger=ledger, env=settings, workers=[worker])
