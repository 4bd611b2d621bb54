"""Escalation on timeout in a real browser, against a real ``turnstile serve`` with a worker
on PostgreSQL: an approval assigned to payments shows in a payments approver's inbox and not
in a lead's; when nobody decides it in time the worker's sweep moves it to leads, recorded on
the approval page, out of payments' inbox and into the lead's, without deciding it; the lead
approves and the worker finishes the transfer. ``/metrics`` counts the escalation and the
reminders. A chain moves it on from group to group, each at its step."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, ViewportSize, expect
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.escalation_app import TOKENS
from tests.acceptance.inbox_ui_support import (
    Stack,
    evidence,
    open_stack,
    screenshot,
    signed_in,
)
from tests.http_support import run_turnstile

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)

ESCALATION_APP = "tests.acceptance.escalation_app:ai"
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


def escalation_stack(
    tmp_path: Path, env: dict[str, str], **options: Any
) -> AbstractContextManager[Stack]:
    """:func:`open_stack` of the escalation app and its approvers, with ``env``."""
    settings = {"TURNSTILE_UI_SECRET": "escalation-ui-acceptance-secret-0123456789abcdef", **env}
    return open_stack(
        tmp_path,
        app=ESCALATION_APP,
        auth="tests.acceptance.escalation_app:auth",
        tokens=TOKENS,
        env=settings,
        **options,
    )


def test_escalation_on_timeout(browser: Browser, tmp_path: Path) -> None:
    env = {"TURNSTILE_TEST_ESCALATE_SECONDS": str(ESCALATE_SECONDS)}
    with (
        escalation_stack(tmp_path, env, worker=False, serve_workers=1) as stack,
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


#: The chain's waits: to leads this long after the approval is asked, to directors after that.
TO_LEADS, TO_DIRECTORS = 5, 8


def test_escalation_chain_moves_the_approval_group_by_group(
    browser: Browser, tmp_path: Path
) -> None:
    """A ``turnstile worker`` sweeping every 0.3 s moves an approval along payments → leads →
    directors: each group's approver finds it in their inbox at its step and the one before
    no longer does; the approval page says which step it reached and what comes next, as
    does ``turnstile approvals show --app``; the director's approval finishes the transfer."""
    env = {
        "TURNSTILE_TEST_CHAIN_SECONDS": f"{TO_LEADS},{TO_DIRECTORS}",
        "TURNSTILE_EXPIRY_INTERVAL": "0.3",
    }
    with (
        escalation_stack(tmp_path, env) as stack,
        signed_in(browser, stack, "paula", viewport=WIDE) as paula,
        signed_in(browser, stack, "lena", viewport=WIDE) as lena,
        signed_in(browser, stack, "dora", viewport=WIDE) as dora,
        evidence(lena, "chain-lena"),
        evidence(dora, "chain-dora"),
    ):
        base = stack.base
        asked = stack.send("Transfer $900 to bob", detach=False)
        assert asked["finishReason"] == "interrupted"
        approval = f"{asked['snapshotId']}:approval-1"

        def row(page: Page) -> Locator:
            return page.locator(f"tr[data-approval='{approval}']")

        expect(row(paula)).to_contain_text("group payments")
        expect(row(lena)).to_have_count(0)
        expect(row(dora)).to_have_count(0)

        # Step 1: payments did not decide in time; the worker moves it to leads.
        expect(row(lena)).to_contain_text("group leads", timeout=(TO_LEADS + 30) * 1000)
        expect(row(paula)).to_have_count(0)
        expect(row(dora)).to_have_count(0)
        lena.goto(f"{base}/ui/approvals/{approval}")
        section = lena.locator("section.assignment")
        expect(section.locator("#escalation")).to_contain_text(
            "from group payments to group leads (step 1 of 2)"
        )
        expect(section.locator("#next-escalation")).to_contain_text(
            "moves to group directors (step 2 of 2)"
        )
        screenshot(lena, "chain-step-1")

        # Step 2: leads did not decide either; it moves on to directors, the chain's end.
        expect(row(dora)).to_contain_text("group directors", timeout=(TO_DIRECTORS + 30) * 1000)
        lena.goto(f"{base}/ui")
        expect(row(lena)).to_have_count(0)
        dora.goto(f"{base}/ui/approvals/{approval}")
        section = dora.locator("section.assignment")
        expect(section.locator("#escalation")).to_contain_text(
            "from group leads to group directors (step 2 of 2)"
        )
        expect(section.locator("#next-escalation")).to_contain_text("none")
        screenshot(dora, "chain-step-2")
        assert stack.transfers() == [], "an escalation decides nothing"

        shown = run_turnstile(
            "approvals", "show", approval, "--app", ESCALATION_APP, db_url=stack.db_url, env=env
        )
        assert shown.returncode == 0, shown.stderr
        assert "escalated to directors (step 2)" in shown.stdout
        assert "step 2 of 2, next: none" in shown.stdout

        dora.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
        dora.get_by_role("button", name="Submit decision").click()
        expect(dora.get_by_role("status").first).to_contain_text("Your decision was recorded.")
        expect(dora.locator("section.result")).to_contain_text("completed", timeout=30_000)
        assert [t["amount"] for t in stack.transfers()] == [900]
