"""Reject in a real browser, against real ``turnstile serve`` and ``turnstile worker``
processes on PostgreSQL: the approver rejects a transfer that guards itself with a reason,
the ledger books nothing, and the model's reply reflects the refusal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.acceptance.inbox_ui_support import evidence, open_edit_stack, screenshot, signed_in

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)


def test_reject_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    """bob sends Reject without a reason (the browser asks for one), then with one: the
    worker's resume books nothing, the turn the page links says the transfer was rejected and
    why, and the history shows the reason."""
    with open_edit_stack(
        tmp_path, secret="reject-ui-acceptance-secret-0123456789abcdefgh"
    ) as stack:
        turn_id = stack.ask("Transfer $40 to carol")
        approval = stack.wait_for_approval(turn_id, who="alice")
        start = f"/ui/approvals/{approval['id']}"

        with signed_in(browser, stack, "bob", start) as page, evidence(page, "reject-bob"):
            form = page.get_by_role("form", name="Reject", exact=True)
            reason = form.get_by_label(re.compile("Reason"))
            form.get_by_role("button", name="Reject").click()
            # The reason is required: the browser keeps the form on the page.
            expect(page.get_by_role("heading", name="Decide")).to_be_visible()
            reason.fill("Carol is not a known payee.")
            screenshot(page, "approval-reject-form")
            form.get_by_role("button", name="Reject").click()
            expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")
            result = page.locator("section.result")
            expect(result).to_contain_text("rejected: Carol is not a known payee.")
            expect(result).to_contain_text("completed", timeout=30_000)
            screenshot(page, "approval-rejected")

            result.get_by_role("link").first.click()
            expect(page.locator("main")).to_contain_text(
                "The transfer was rejected: Carol is not a known payee."
            )

            page.goto(f"{stack.base}/ui/history")
            expect(page.locator("#history")).to_contain_text(
                "rejected: Carol is not a known payee."
            )

        assert stack.transfers() == []
