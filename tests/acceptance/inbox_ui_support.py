"""Real browsers against real processes for the inbox UI's acceptance tests.

A :class:`Stack` is a fresh database with a ``turnstile serve`` process (by default the
banking example with the bearer tokens of :mod:`tests.acceptance.inbox_ui_auth`, approvers by
role) and, by default, one ``turnstile worker`` process; the browser is Debian's Chromium driven
by Playwright (Playwright's own browser download is not used). Screenshots go to
``tests/artifacts/``.
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
from typing import Any, Literal, TypeVar

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, ViewportSize, sync_playwright

from examples.banking import read_ledger
from tests.acceptance.edit_app import TOKENS as EDIT_TOKENS
from tests.acceptance.inbox_ui_auth import TOKENS
from tests.databases import new_sqlite_database, postgres_url
from tests.http_support import ROOT, serve_process, worker_process

__all__ = [
    "ARTIFACTS",
    "CHROMIUM",
    "Stack",
    "eventually",
    "evidence",
    "launch_chromium",
    "new_page",
    "open_edit_stack",
    "open_stack",
    "screenshot",
    "sign_in",
    "signed_in",
]

#: Debian's Chromium (``apt-get install chromium``; ``.ci/run`` installs it when missing).
CHROMIUM = os.environ.get("TURNSTILE_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "tests" / "artifacts" / "inbox-ui"
AUTH_SPEC = "tests.acceptance.inbox_ui_auth:auth"
BANKING_APP = "examples.banking:ai"
DESKTOP: ViewportSize = {"width": 1100, "height": 900}

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


def sign_in(
    page: Page,
    base: str,
    who: str,
    *,
    start: str = "/ui",
    tokens: dict[str, str] = TOKENS,
    keyboard: bool = False,
) -> None:
    """Sign ``who`` in through the login form (from ``start``, which sends the browser to
    it), pressing Enter instead of the button if ``keyboard``, and wait for the page it leads
    back to."""
    page.goto(f"{base}{start}")
    page.wait_for_url("**/ui/login**")
    page.get_by_label("Token").fill(tokens[who])
    if keyboard:
        page.keyboard.press("Enter")
    else:
        page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector(f"text=Signed in as {who}")


@contextlib.contextmanager
def new_page(
    browser: Browser, *, viewport: ViewportSize = DESKTOP, **options: Any
) -> Iterator[Page]:
    """A page in a browser context of its own (its own cookies), closed after the block."""
    context = browser.new_context(viewport=viewport, **options)
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


@dataclass
class Stack:
    """A database, a ``turnstile serve`` and the ``turnstile worker`` processes on it."""

    base: str
    db_url: str
    ledger: Path
    env: dict[str, str]
    tokens: dict[str, str] = field(default_factory=lambda: dict(TOKENS))
    agent: str = "bankingAgent"
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def api(self, who: str) -> httpx.Client:
        """An HTTP client of the JSON API with ``who``'s bearer token."""
        return httpx.Client(
            base_url=self.base,
            headers={"Authorization": f"Bearer {self.tokens[who]}"},
            timeout=30,
        )

    def send(self, text: str, *, who: str = "alice", detach: bool = True) -> dict[str, Any]:
        """Run a turn of the stack's agent as ``who`` (detached unless told); its result."""
        message = {"role": "user", "content": [{"text": text}]}
        body: dict[str, Any] = {"message": message}
        if detach:
            body["detach"] = True
        with self.api(who) as client:
            answer = client.post(f"/api/{self.agent}", json={"data": body})
        answer.raise_for_status()
        return dict(answer.json()["result"])

    def ask(self, text: str, *, who: str = "alice") -> str:
        """Start a turn of the stack's agent as ``who`` (detached); its snapshot id."""
        return str(self.send(text, who=who)["snapshotId"])

    def approval(self, turn_id: str, *, who: str = "bob") -> dict[str, Any] | None:
        """The inbox entry of the turn's first approval as ``who`` sees it (JSON API), or
        ``None``."""
        with self.api(who) as client:
            found = client.get("/inbox", params={"agent": self.agent})
        found.raise_for_status()
        items = [i for i in found.json()["items"] if i["turnId"] == turn_id]
        return items[0] if items else None

    def wait_for_approval(self, turn_id: str, *, who: str = "bob") -> dict[str, Any]:
        """The approval once the worker paused the turn at it."""
        return eventually(
            lambda: self.approval(turn_id, who=who), timeout=30, what=f"an approval of {turn_id}"
        )

    def snapshot(self, snapshot_id: str, *, who: str = "alice") -> dict[str, Any]:
        """``getSnapshot`` of a turn."""
        with self.api(who) as client:
            got = client.post(
                f"/api/{self.agent}/getSnapshot", json={"data": {"snapshotId": snapshot_id}}
            )
        got.raise_for_status()
        return dict(got.json()["result"])

    def transfers(self) -> list[dict[str, Any]]:
        """What the workers booked in the ledger (once per idempotency key)."""
        return read_ledger(self.ledger)


@contextlib.contextmanager
def _database(kind: Literal["postgres", "sqlite"]) -> Iterator[str]:
    if kind == "sqlite":
        yield new_sqlite_database()
    else:
        with postgres_url() as url:
            yield url


@contextlib.contextmanager
def open_stack(
    tmp_path: Path,
    *,
    app: str = BANKING_APP,
    auth: str = AUTH_SPEC,
    tokens: dict[str, str] = TOKENS,
    agent: str = "bankingAgent",
    env: dict[str, str] | None = None,
    worker: bool = True,
    serve_workers: int = 0,
    database: Literal["postgres", "sqlite"] = "postgres",
) -> Iterator[Stack]:
    """A fresh database with a server of ``app`` (``--auth``, approvers by role) and, if
    ``worker``, a ``turnstile worker`` process; ``serve_workers`` runs workers inside the
    server instead; ``env`` overrides the default settings."""
    ledger = tmp_path / "ledger.jsonl"
    settings = {
        "TURNSTILE_LEDGER": str(ledger),
        "TURNSTILE_UI_POLL_SECONDS": "0.5",
        "TURNSTILE_UI_SECRET": "inbox-ui-acceptance-secret-0123456789abcdef",
        **(env or {}),
    }
    args = ["--auth", auth, "--inbox-policy", "role:approver"]
    with contextlib.ExitStack() as resources:
        url = resources.enter_context(_database(database))
        base, _serve = resources.enter_context(
            serve_process(
                url,
                app=app,
                workers=serve_workers,
                args=args,
                env=settings,
                log=tmp_path / "serve.log",
            )
        )
        workers = (
            [resources.enter_context(worker_process(url, app=app, env=settings))] if worker else []
        )
        yield Stack(
            base=base,
            db_url=url,
            ledger=ledger,
            env=settings,
            tokens=tokens,
            agent=agent,
            workers=workers,
        )


def open_edit_stack(tmp_path: Path, *, secret: str) -> contextlib.AbstractContextManager[Stack]:
    """A stack of :mod:`tests.acceptance.edit_app` (``guardedAgent``; alice asks, alice and
    bob approve) with a worker, signing UI sessions with ``secret``."""
    return open_stack(
        tmp_path,
        app="tests.acceptance.edit_app:ai",
        auth="tests.acceptance.edit_app:auth",
        tokens=EDIT_TOKENS,
        agent="guardedAgent",
        env={"TURNSTILE_UI_SECRET": secret},
    )


@contextlib.contextmanager
def signed_in(
    browser: Browser,
    stack: Stack,
    who: str,
    start: str = "/ui",
    *,
    viewport: ViewportSize = DESKTOP,
    keyboard: bool = False,
    **options: Any,
) -> Iterator[Page]:
    """A page of a browser context of its own, with ``who`` signed in (with the stack's
    tokens), at ``start``."""
    with new_page(browser, viewport=viewport, **options) as page:
        sign_in(page, stack.base, who, start=start, tokens=stack.tokens, keyboard=keyboard)
        yield page


def pause_transfer(base: str, who: str, amount: int = 9) -> None:
    """A transfer of ``amount`` asked by ``who`` over the API of the server at ``base``,
    paused for approval when the request returns."""
    message = {"role": "user", "content": [{"text": f"Transfer ${amount} to x"}]}
    answer = httpx.post(
        f"{base}/api/bankingAgent",
        json={"data": {"message": message}, "init": {}},
        headers={"authorization": f"Bearer {TOKENS[who]}"},
        timeout=60,
    )
    assert answer.json()["result"]["finishReason"] == "interrupted", answer.text
