"""A two-person quorum in a real browser, against real ``turnstile serve`` and ``turnstile
worker`` processes on PostgreSQL: the requester's approval refused (maker-checker), a first
vote leaving the turn paused, a second approver's vote letting the worker finish the transfer;
and an open inbox showing a vote and a claim live, through the event stream alone."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.acceptance.inbox_ui_support import Stack, evidence, open_stack, screenshot, signed_in
from tests.acceptance.policy_app import TOKENS

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)


def policy_stack(tmp_path: Path, *, poll_seconds: str) -> contextlib.AbstractContextManager[Stack]:
    """The banking agent under a two-person quorum (every user an approver), and a worker."""
    env = {
        "TURNSTILE_UI_POLL_SECONDS": poll_seconds,
        "TURNSTILE_UI_SECRET": "policy-ui-acceptance-secret-0123456789abcdef",
    }
    return open_stack(
        tmp_path,
        app="tests.acceptance.policy_app:ai",
        auth="tests.acceptance.policy_app:auth",
        tokens=TOKENS,
        env=env,
    )


def approve(page: Page) -> None:
    page.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
    page.get_by_role("button", name="Submit decision").click()


def test_two_person_quorum_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    with policy_stack(tmp_path, poll_seconds="0.5") as stack:
        turn_id = stack.ask("Transfer $700 to bob")
        approval = stack.wait_for_approval(turn_id, who="alice")
        start = f"/ui/approvals/{approval['id']}"

        with signed_in(browser, stack, "alice", start) as page, evidence(page, "policy-alice"):
            approve(page)
            expect(page.get_by_role("alert").first).to_contain_text("maker-checker")

        with signed_in(browser, stack, "bob", start) as page, evidence(page, "policy-bob"):
            votes = page.locator("section.votes")
            expect(votes).to_contain_text("0 of 2 required")
            approve(page)
            expect(page.get_by_role("status").first).to_contain_text("Your vote was recorded")
            expect(votes).to_contain_text("1 of 2 required")
            expect(votes.get_by_role("table", name="Votes so far")).to_contain_text("bob")
            screenshot(page, "approval-quorum-one-vote")
        assert stack.transfers() == []

        with signed_in(browser, stack, "carol", start) as page, evidence(page, "policy-carol"):
            approve(page)
            expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")
            result = page.locator("section.result")
            expect(result).to_contain_text("carol")
            expect(result).to_contain_text("completed", timeout=30_000)
            expect(page.locator("section.votes")).to_contain_text("2 of 2 required")
            screenshot(page, "approval-quorum-decided")
        assert [t["amount"] for t in stack.transfers()] == [700]


def test_an_open_inbox_shows_a_vote_and_a_claim_without_polling(
    browser: Browser, tmp_path: Path
) -> None:
    """With polling slowed to ten minutes, bob's open inbox shows his vote and his claim made
    elsewhere (the JSON inbox) as they happen: the event stream announces both, though neither
    changes the turn's status."""
    with policy_stack(tmp_path, poll_seconds="600") as stack, stack.api("bob") as bob_api:
        turn_id = stack.ask("Transfer $700 to bob")
        approval = stack.wait_for_approval(turn_id, who="alice")
        with signed_in(browser, stack, "bob") as page, evidence(page, "policy-live"):
            row = page.locator(f"tr[data-approval='{approval['id']}']")
            expect(row).to_contain_text("0 of 2 approvals")
            page.wait_for_timeout(1_500)  # the stream is open and its first look is done
            voted = bob_api.post(
                f"/inbox/{approval['id']}/decision", json={"respond": {"approved": True}}
            )
            assert voted.status_code == 200, voted.text
            expect(row).to_contain_text("1 of 2 approvals", timeout=10_000)
            claimed = bob_api.post(f"/inbox/{approval['id']}/assignment", json={"action": "claim"})
            assert claimed.status_code == 200, claimed.text
            expect(row.locator("td[data-label='Assigned to']")).to_have_text("bob", timeout=10_000)
            screenshot(page, "inbox-live-vote-and-claim")
