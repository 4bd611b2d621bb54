"""Edit before approve in a real browser, against real ``turnstile serve`` and ``turnstile
worker`` processes on PostgreSQL: the approver changes the amount in the arguments form and
approves, the worker transfers the edited amount once, and the history shows the diff."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.acceptance.inbox_ui_support import evidence, open_edit_stack, screenshot, signed_in

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)


def test_edit_before_approve_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    """bob changes the amount from 40 to 500 and approves; the worker books 500 once under
    the edited call's key; the approval page and the history show the diff."""
    with open_edit_stack(tmp_path, secret="edit-ui-acceptance-secret-0123456789abcdefgh") as stack:
        turn_id = stack.ask("Transfer $40 to carol")
        approval = stack.wait_for_approval(turn_id, who="alice")
        start = f"/ui/approvals/{approval['id']}"

        with signed_in(browser, stack, "bob", start) as page, evidence(page, "edit-bob"):
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

            page.goto(f"{stack.base}/ui/history")
            expect(page.locator("#history")).to_contain_text("amount: 40 → 500 (by bob)")
            screenshot(page, "history-edited")

        booked = stack.transfers()
        assert [(t["amount"], t["toAccount"]) for t in booked] == [(500, "carol")]
        assert ":edited-" in booked[0]["key"]
