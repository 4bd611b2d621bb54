"""The inbox web app in a real browser, against real ``turnstile serve`` and ``turnstile worker``
processes on PostgreSQL: signing in, an approval appearing live, approving and denying from the
form, a forged form refused, and the turn inspector after a worker was SIGKILLed."""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.acceptance.inbox_ui_support import (
    Stack,
    eventually,
    evidence,
    open_stack,
    screenshot,
    sign_in,
)
from tests.http_support import free_port, worker_process

pytestmark = pytest.mark.postgres
# Pages load while two processes and a browser share the machine's cores: wait generously.
expect.set_options(timeout=15_000)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with open_stack(tmp_path) as opened:
        yield opened


def approval_url(stack: Stack, approval: dict[str, object]) -> str:
    return f"{stack.base}/ui/approvals/{approval['id']}"


def test_sign_in_shows_the_inbox_and_sign_out_ends_the_session(stack: Stack, page: Page) -> None:
    """A browser without a session is sent to the login page; a wrong token is refused on the
    page, the right one opens the inbox, and signing out closes it again."""
    page.goto(f"{stack.base}/ui")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui$"))
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    screenshot(page, "login")

    page.get_by_label("Token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("That token was not accepted.")

    page.get_by_label("Token").fill("bob-token-0123456789")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{stack.base}/ui")
    expect(page.get_by_text("Signed in as bob")).to_be_visible()
    expect(page).to_have_title("(0) Inbox · Turnstile")
    cookie = next(c for c in page.context.cookies() if c["name"] == "turnstile_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/ui/login"))
    page.goto(f"{stack.base}/ui/history")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Fhistory$"))
    # The JSON inbox API keeps taking bearer tokens.
    with stack.api("bob") as client:
        assert client.get("/inbox").status_code == 200


def test_a_new_approval_appears_in_the_open_inbox_without_a_reload(
    stack: Stack, page: Page
) -> None:
    sign_in(page, stack.base, "bob")
    expect(page).to_have_title("(0) Inbox · Turnstile")
    page.evaluate("window.stillTheSamePage = true")

    turn_id = stack.ask("Transfer $75 to dave")

    row = page.locator("#inbox-rows tr[data-approval]")
    expect(row).to_have_count(1, timeout=30_000)
    expect(row).to_contain_text("Transfer $75 to dave")
    expect(row).to_contain_text("alice")
    expect(page).to_have_title("(1) Inbox · Turnstile")
    expect(page.locator("#inbox-count")).to_have_text("1")
    assert page.evaluate("window.stillTheSamePage") is True, "the page was reloaded"
    assert row.get_attribute("data-approval") == f"{turn_id}:approval-1"
    screenshot(page, "inbox")

    # Mallory is signed in too, but none of Alice's approvals are hers to decide.
    other = page.context.browser
    assert other is not None
    mallory = other.new_context().new_page()
    sign_in(mallory, stack.base, "mallory")
    expect(mallory.locator("#inbox-rows tr[data-approval]")).to_have_count(0)
    answer = mallory.goto(approval_url(stack, stack.wait_for_approval(turn_id)))
    assert answer is not None and answer.status == 404
    mallory.context.close()


def test_approving_from_the_form_lets_the_worker_finish_the_transfer(
    stack: Stack, page: Page
) -> None:
    turn_id = stack.ask("Transfer $500 to my savings account")
    approval = stack.wait_for_approval(turn_id)
    sign_in(page, stack.base, "bob", start=f"/ui/approvals/{approval['id']}")

    # The page leads with what is asked (the example's declared summary).
    expect(page.get_by_role("heading", level=1)).to_contain_text(
        "Transfer $500 to my savings account"
    )
    asked = page.get_by_role("table", name=re.compile("arguments of the paused call"))
    expect(asked).to_contain_text("Transfer $500 to my savings account")
    expect(page.locator(".facts")).to_contain_text("alice")
    expect(page.locator(".conversation").first).to_contain_text(
        "Transfer $500 to my savings account"
    )
    screenshot(page, "approval")

    page.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
    page.get_by_label("Feedback").fill("fine by me")
    page.get_by_role("button", name="Submit decision").click()
    expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")
    result = page.locator("section.result")
    expect(result).to_contain_text("bob")
    expect(result).to_contain_text("approved: Yes; feedback: fine by me")
    # The page watches the resumed turn and reloads once the worker settled it.
    expect(result).to_contain_text("completed", timeout=30_000)
    screenshot(page, "approval-decided")

    assert [t["amount"] for t in stack.transfers()] == [500]
    latest = stack.snapshot(turn_id)
    assert latest["finishReason"] == "interrupted"  # the paused turn itself stays as it was
    result.get_by_role("link").first.click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("completed")
    calls = page.locator("#calls")
    expect(calls).to_contain_text("transferMoney")
    expect(calls).to_contain_text("done")
    expect(page.locator(".conversation").last).to_contain_text(
        "Done. Transaction txn-500-my-savings-account."
    )


def test_denying_cancels_the_transfer_and_shows_in_the_history(stack: Stack, page: Page) -> None:
    turn_id = stack.ask("Transfer $9000 to mallory")
    approval = stack.wait_for_approval(turn_id)
    sign_in(page, stack.base, "bob", start=f"/ui/approvals/{approval['id']}")

    page.get_by_role("button", name="Submit decision").click()  # nothing chosen yet
    assert page.evaluate(
        "document.querySelector('input[name=\"field.approved\"]').validity.valueMissing"
    ), "the browser should ask for the required choice before posting"

    page.get_by_role("group", name=re.compile("Approved")).get_by_label("No").check()
    page.get_by_label("Feedback").fill("too much")
    page.get_by_role("button", name="Submit decision").click()
    result = page.locator("section.result")
    expect(result).to_contain_text("approved: No; feedback: too much")
    expect(result).to_contain_text("completed", timeout=30_000)
    assert stack.transfers() == []

    page.get_by_role("link", name="History").click()
    history = page.locator("#history tbody tr")
    expect(history).to_have_count(1)
    expect(history).to_contain_text("bob")
    expect(history).to_contain_text("alice")
    expect(history).to_contain_text("approved: No; feedback: too much")
    expect(history).to_contain_text("completed")
    screenshot(page, "history")

    exported = page.context.request.get(f"{stack.base}/ui/history.csv?decided_by=bob")
    assert exported.status == 200
    assert exported.headers["content-type"].startswith("text/csv")
    lines = exported.text().splitlines()
    assert lines[0].startswith("decided_at,agent,interrupt,summary,turn_id")
    assert len(lines) == 2 and turn_id in lines[1] and ",bob," in lines[1]
    none = page.context.request.get(f"{stack.base}/ui/history.csv?decided_by=carol")
    assert none.text().splitlines()[1:] == []


class _HostilePage(BaseHTTPRequestHandler):
    """Another site's page that posts a decision form to the server as soon as it loads."""

    target = ""

    def do_GET(self) -> None:
        body = (
            "<!doctype html><form id=f method=post action='" + self.target + "'>"
            "<input name=action value=respond><input name='field.approved' value=true>"
            "</form><script>document.getElementById('f').submit()</script>"
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def test_forged_decisions_are_refused_and_change_nothing(stack: Stack, page: Page) -> None:
    turn_id = stack.ask("Transfer $300 to eve")
    approval = stack.wait_for_approval(turn_id)
    sign_in(page, stack.base, "bob", start=f"/ui/approvals/{approval['id']}")
    target = f"{stack.base}/ui/approvals/{approval['id']}/decision"

    # From the signed-in page itself, a post without the session's token, or with another.
    for token in ("", "&csrf_token=forged"):
        status = page.evaluate(
            """async ([target, extra]) => (await fetch(target, {method: 'POST',
                 headers: {'content-type': 'application/x-www-form-urlencoded'},
                 body: 'action=respond&field.approved=true' + extra})).status""",
            [target, token],
        )
        assert status == 403

    # From another site (localhost is not 127.0.0.1): its form posts into the browser session.
    _HostilePage.target = target
    hostile = ThreadingHTTPServer(("localhost", free_port()), _HostilePage)
    threading.Thread(target=hostile.serve_forever, daemon=True).start()
    try:
        with page.expect_response(lambda r: r.url == target) as posted:
            page.goto(f"http://localhost:{hostile.server_address[1]}/")
        assert posted.value.status == 403
        expect(page.get_by_role("heading", level=1)).to_have_text("Form refused")
        screenshot(page, "csrf-refused")
    finally:
        hostile.shutdown()
        hostile.server_close()

    still = stack.approval(turn_id)
    assert still is not None and still["id"] == approval["id"], "the approval was decided"
    with stack.api("bob") as client:
        shown = client.get(f"/inbox/{approval['id']}").json()
    assert shown["open"] is True
    # The session survived: Bob can still decide through his own form.
    page.goto(f"{stack.base}/ui/approvals/{approval['id']}")
    expect(page.get_by_text("Signed in as bob")).to_be_visible()
    expect(page.get_by_role("button", name="Submit decision")).to_be_visible()


@pytest.mark.timeout(150)
def test_the_turn_inspector_shows_a_turn_recovered_after_its_worker_was_killed(
    tmp_path: Path, page: Page
) -> None:
    """SIGKILL the worker in the middle of the approved transfer: another worker claims the
    turn once its lease expired and finishes it; the inspector, open all along, shows the
    second attempt and the settled turn, and the money moved once."""
    # A short lease, so the second worker claims the turn soon after the kill; long enough
    # that a loaded machine does not make a live worker lose it too.
    slow = {"TURNSTILE_TRANSFER_SECONDS": "4", "TURNSTILE_LEASE_SECONDS": "4"}
    with open_stack(tmp_path, env=slow) as stack, evidence(page, "turn-inspector"):
        turn_id = stack.ask("Transfer $120 to frank")
        approval = stack.wait_for_approval(turn_id)
        sign_in(page, stack.base, "bob", start=f"/ui/approvals/{approval['id']}")
        page.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
        page.get_by_role("button", name="Submit decision").click()
        expect(page.get_by_role("status").first).to_contain_text("recorded")

        eventually(stack.transfers, timeout=30, what="the transfer to start")
        first = stack.workers[0]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)

        page.reload()
        page.locator("section.result").get_by_role("link").first.click()
        heading = page.get_by_role("heading", level=1)
        expect(heading).to_contain_text("queued or running")
        expect(page.locator(".facts")).to_contain_text("1 of at most 3")
        screenshot(page, "turn-inspector-worker-killed")

        with worker_process(stack.db_url, env=stack.env):
            expect(heading).to_contain_text("completed", timeout=60_000)
        facts = page.locator(".facts")
        expect(facts).to_contain_text(
            re.compile(r"[23] of at most 3")
        )  # the second claim, at least
        calls = page.locator("#calls")
        expect(calls).to_contain_text("transferMoney")
        expect(calls).to_contain_text("done")
        expect(page.locator("#timeline")).to_contain_text("pending -> completed")
        screenshot(page, "turn-inspector")
        assert [t["amount"] for t in stack.transfers()] == [120], "booked once, by its key"
