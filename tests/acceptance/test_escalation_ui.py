"""Escalation on timeout in a real browser, against a real ``turnstile serve`` with a worker
on PostgreSQL: an approval assigned to payments shows in a payments approver's inbox and not
in a lead's; when nobody decides it in time the worker's sweep moves it to leads, recorded on
the approval page, out of payments' inbox and into the lead's, without deciding it; the lead
approves and the worker finishes the transfer. ``/metrics`` counts the escalation and the
reminders."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, ViewportSize, expect
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.escalation_app import TOKENS
from tests.acceptance.inbox_ui_support import evidence, open_stack, screenshot, signed_in

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)

ESCALATE_SECONDS = 12
WIDE: ViewportSize = {"width": 1200, "height": 900}


def counter(base: str, name: str, agent: str) -> float:
    """One sample of ``/metrics`` (0 when the series does not exist)."""
    response = httpx.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("agent") == agent:
                return float(sample.value)
    return 0.0


def test_escalation_on_timeout(browser: Browser, tmp_path: Path) -> None:
    env = {
        "TURNSTILE_UI_SECRET": "escalation-ui-acceptance-secret-0123456789abcdef",
        "TURNSTILE_TEST_ESCALATE_SECONDS": str(ESCALATE_SECONDS),
    }
    with (
        open_stack(
            tmp_path,
            app="tests.acceptance.escalation_app:ai",
            auth="tests.acceptance.escalation_app:auth",
            tokens=TOKENS,
            env=env,
            worker=False,
            serve_workers=1,
        ) as stack,
        signed_in(browser, stack, "paula", viewport=WIDE) as paula,
        signed_in(browser, stack, "lena", viewport=WIDE) as lena,
        evidence(paula, "escalation-paula"),
        evidence(lena, "escalation-lena"),
    ):
        base = stack.base
        assert counter(base, "turnstile_approval_escalations_total", "bankingAgent") == 0
        asked = stack.send("Transfer $900 to bob", detach=False)
        assert asked["finishReason"] == "interrupted"
        approval = f"{asked['snapshotId']}:approval-1"

        row_for_paula = paula.locator(f"tr[data-approval='{approval}']")
        expect(row_for_paula).to_contain_text("group payments")
        screenshot(paula, "escalation-payments-inbox")
        expect(lena.locator(f"tr[data-approval='{approval}']")).to_have_count(0)

        # Nobody in payments decides: the worker's sweep moves it to leads after the timeout.
        row_for_lena = lena.locator(f"tr[data-approval='{approval}']")
        expect(row_for_lena).to_contain_text(
            "group leads", timeout=ESCALATE_SECONDS * 1000 + 30_000
        )
        expect(row_for_paula).to_have_count(0)
        assert stack.transfers() == [], "an escalation decides nothing"

        lena.goto(f"{base}/ui/approvals/{approval}")
        section = lena.locator("section.assignment")
        expect(section.locator("#assigned-to")).to_contain_text("group leads")
        expect(section.locator("#assigned-to")).to_contain_text("escalation")
        expect(section.locator("#escalation")).to_contain_text("from group payments to group leads")
        expect(
            lena.get_by_role("heading", name=re.compile("Transfer \\$900 to bob"))
        ).to_contain_text("Waiting")
        screenshot(lena, "escalation-approval-page")

        paula.goto(f"{base}/ui/approvals/{approval}")
        paula.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
        paula.get_by_role("button", name="Submit decision").click()
        expect(paula.get_by_role("alert").first).to_contain_text("group leads")

        lena.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
        lena.get_by_role("button", name="Submit decision").click()
        expect(lena.get_by_role("status").first).to_contain_text("Your decision was recorded.")
        expect(lena.locator("section.result")).to_contain_text("completed", timeout=30_000)
        assert [t["amount"] for t in stack.transfers()] == [900]

        assert counter(base, "turnstile_approval_escalations_total", "bankingAgent") == 1
        reminders = counter(base, "turnstile_approval_reminders_total", "bankingAgent")
        assert reminders >= 1
