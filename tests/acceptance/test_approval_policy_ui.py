"""A two-person quorum in a real browser, against real ``turnstile serve`` and ``turnstile
worker`` processes on PostgreSQL: the requester's approval refused (maker-checker), a first
vote leaving the turn paused, a second approver's vote letting the worker finish the transfer;
and an open inbox showing a vote and a claim live, through the event stream alone."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from examples.banking import read_ledger
from tests.acceptance.inbox_ui_support import eventually, evidence, launch_chromium, screenshot
from tests.acceptance.policy_app import TOKENS
from tests.databases import postgres_url
from tests.http_support import serve_process, worker_process

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)

APP = "tests.acceptance.policy_app:ai"


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


def approve(page: Page) -> None:
    page.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
    page.get_by_role("button", name="Submit decision").click()


def test_two_person_quorum_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "TURNSTILE_LEDGER": str(ledger),
        "TURNSTILE_UI_POLL_SECONDS": "0.5",
        "TURNSTILE_UI_SECRET": "policy-ui-acceptance-secret-0123456789abcdef",
    }
    args = ["--auth", "tests.acceptance.policy_app:auth", "--inbox-policy", "role:approver"]
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
            "/api/bankingAgent",
            json={
                "data": {
                    "message": {"role": "user", "content": [{"text": "Transfer $700 to bob"}]},
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

        with signed_in(browser, base, "alice", start) as page, evidence(page, "policy-alice"):
            approve(page)
            expect(page.get_by_role("alert").first).to_contain_text("maker-checker")

        with signed_in(browser, base, "bob", start) as page, evidence(page, "policy-bob"):
            votes = page.locator("section.votes")
            expect(votes).to_contain_text("0 of 2 required")
            approve(page)
            expect(page.get_by_role("status").first).to_contain_text("Your vote was recorded")
            expect(votes).to_contain_text("1 of 2 required")
            expect(votes.get_by_role("table", name="Votes so far")).to_contain_text("bob")
            screenshot(page, "approval-quorum-one-vote")
        assert read_ledger(ledger) == []

        with signed_in(browser, base, "carol", start) as page, evidence(page, "policy-carol"):
            approve(page)
            expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")
            result = page.locator("section.result")
            expect(result).to_contain_text("carol")
            expect(result).to_contain_text("completed", timeout=30_000)
            expect(page.locator("section.votes")).to_contain_text("2 of 2 required")
            screenshot(page, "approval-quorum-decided")
        assert [t["amount"] for t in read_ledger(ledger)] == [700]


def test_an_open_inbox_shows_a_vote_and_a_claim_without_polling(
    browser: Browser, tmp_path: Path
) -> None:
    """With polling slowed to ten minutes, bob's open inbox shows his vote and his claim made
    elsewhere (the JSON inbox) as they happen: the event stream announces both, though neither
    changes the turn's status."""
    env = {
        "TURNSTILE_LEDGER": str(tmp_path / "ledger.jsonl"),
        "TURNSTILE_UI_POLL_SECONDS": "600",
        "TURNSTILE_UI_SECRET": "policy-ui-acceptance-secret-0123456789abcdef",
    }
    args = ["--auth", "tests.acceptance.policy_app:auth", "--inbox-policy", "role:approver"]
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
        httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {TOKENS['bob']}"}, timeout=30
        ) as bob_api,
    ):
        message = {"role": "user", "content": [{"text": "Transfer $700 to bob"}]}
        asked = alice_api.post(
            "/api/bankingAgent", json={"data": {"message": message, "detach": True}}
        )
        asked.raise_for_status()
        turn_id = asked.json()["result"]["snapshotId"]

        def listed() -> dict[str, object] | None:
            items = alice_api.get("/inbox").json()["items"]
            return next((i for i in items if i["turnId"] == turn_id), None)

        approval = eventually(listed, timeout=30, what="the approval")
        with signed_in(browser, base, "bob", "/ui") as page, evidence(page, "policy-live"):
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
