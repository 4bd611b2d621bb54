"""Edit before approve in a real browser, against real ``turnstile serve`` and ``turnstile
worker`` processes on PostgreSQL: the approver changes the amount in the arguments form and
approves, the worker transfers the edited amount once, and the history shows the diff."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from examples.banking import read_ledger
from tests.acceptance.edit_app import TOKENS
from tests.acceptance.inbox_ui_support import eventually, evidence, launch_chromium, screenshot
from tests.databases import postgres_url
from tests.http_support import serve_process, worker_process

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)

APP = "tests.acceptance.edit_app:ai"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launch_chromium() as launched:
        yield launched


@contextlib.contextmanager
def signed_in(browser: Browser, base: str, who: str, start: str) -> Iterator[Page]:
    """A page of a browser context of its own, with ``who`` signed in, at ``start``."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        page.goto(f"{base}{start}")
        page.wait_for_url("**/ui/login**")
        page.get_by_label("Token").fill(TOKENS[who])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector(f"text=Signed in as {who}")
        yield page
    finally:
        context.close()


def test_edit_before_approve_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    """bob changes the amount from 40 to 500 and approves; the worker books 500 once under
    the edited call's key; the approval page and the history show the diff."""
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "TURNSTILE_LEDGER": str(ledger),
        "TURNSTILE_UI_POLL_SECONDS": "0.5",
        "TURNSTILE_UI_SECRET": "edit-ui-acceptance-secret-0123456789abcdefgh",
    }
    args = ["--auth", "tests.acceptance.edit_app:auth", "--inbox-policy", "role:approver"]
    with (
        postgres_url() as url,
        serve_process(url, app=APP, args=args, env=env, log=tmp_path / "serve.log") as (
            base,
            _serve,
        ),
        worker_process(url, app=APP, env=env),
        httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {TOKENS['alice']}"}, timeout=30
        ) as alice_api,
    ):
        asked = alice_api.post(
            "/api/guardedAgent",
            json={
                "data": {
                    "message": {"role": "user", "content": [{"text": "Transfer $40 to carol"}]},
                    "detach": True,
                }
            },
        )
        asked.raise_for_status()
        turn_id = asked.json()["result"]["snapshotId"]

        def listed() -> dict[str, object] | None:
            items = alice_api.get("/inbox").json()["items"]
            return next((i for i in items if i["turnId"] == turn_id), None)

        approval = eventually(listed, timeout=30, what="the approval")
        start = f"/ui/approvals/{approval['id']}"

        with signed_in(browser, base, "bob", start) as page, evidence(page, "edit-bob"):
            form = page.locator("form#edit-form")
            amount = form.get_by_label(re.compile("Amount"))
            expect(amount).to_have_value("40")
            amount.fill("500")
            screenshot(page, "approval-edit-form")
            form.get_by_role("button", name="Approve with these arguments").click()
            expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")
            result = page.locator("section.result")
            expect(result).to_contain_text("completed", timeout=30_000)
            diff = page.get_by_role("table", name=re.compile("Arguments edited by bob"))
            expect(diff.get_by_role("row", name=re.compile("amount"))).to_contain_text("500")
            screenshot(page, "approval-edited")

            page.goto(f"{base}/ui/history")
            expect(page.locator("#history")).to_contain_text("amount: 40 → 500 (by bob)")
            screenshot(page, "history-edited")

        booked = read_ledger(ledger)
        assert [(t["amount"], t["toAccount"]) for t in booked] == [(500, "carol")]
        assert ":edited-" in booked[0]["key"]
