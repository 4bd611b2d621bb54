"""Browser sessions and live updates of the inbox web app, against real ``turnstile serve``
and ``turnstile worker`` processes on PostgreSQL: a cookie replayed after logout (or after an
operator's revoke) is refused, a new approval arrives through the event stream, and failed
sign-ins are limited across two server processes sharing the database."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from playwright._impl._api_structures import SetCookieParam
from playwright.sync_api import Browser, Page, Route, expect

from tests.acceptance.inbox_ui_auth import TOKENS
from tests.acceptance.inbox_ui_support import (
    AUTH_SPEC,
    Stack,
    eventually,
    evidence,
    open_stack,
    screenshot,
    sign_in,
)
from tests.databases import postgres_url
from tests.http_support import ROOT, serve_process, worker_process

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)

#: The inbox pages' event stream, whatever its query string.
EVENTS = re.compile(r"/ui/events(\?.*)?$")


def test_a_cookie_replayed_after_logout_or_revoke_is_refused(
    tmp_path: Path, browser: Browser, page: Page
) -> None:
    """Cookies copied from a signed-in browser stop working once it signs out, and once an
    operator revokes the principal's sessions with ``turnstile ui sessions revoke``."""
    with open_stack(tmp_path) as stack, evidence(page, "sessions-replay"):
        sign_in(page, stack.base, "bob")
        (session,) = [c for c in page.context.cookies() if c["name"] == "turnstile_ui"]
        copied: list[SetCookieParam] = [
            {"name": session["name"], "value": session["value"], "url": f"{stack.base}/ui"}
        ]
        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(re.compile(r"/ui/login"))

        thief = browser.new_context()
        try:
            thief.add_cookies(copied)
            replayed = thief.new_page()
            replayed.goto(f"{stack.base}/ui")
            expect(replayed).to_have_url(re.compile(r"/ui/login\?next="))
            live = thief.request.get(f"{stack.base}/ui/inbox/live")
            assert live.status == 401
        finally:
            thief.close()

        sign_in(page, stack.base, "bob")
        listed = _turnstile(stack, "ui", "sessions", "ls", "--principal", "bob", "--json")
        assert '"state": "live"' in listed
        _turnstile(stack, "ui", "sessions", "revoke", "--principal", "bob")
        page.reload()
        expect(page).to_have_url(re.compile(r"/ui/login\?next="))
        screenshot(page, "signed-out-by-revoke")


def _turnstile(stack: Stack, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args, "--db", stack.db_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_new_approval_arrives_through_the_event_stream(tmp_path: Path, page: Page) -> None:
    """With polling slowed to ten minutes, a new approval still appears in the open inbox at
    once: the page's EventSource stream (``/ui/events``) told it to look."""
    with (
        open_stack(tmp_path, env={"TURNSTILE_UI_POLL_SECONDS": "600"}) as stack,
        evidence(page, "sessions-sse"),
    ):
        with page.expect_response(lambda r: "/ui/events" in r.url) as stream:
            sign_in(page, stack.base, "bob")
        opened = stream.value
        assert opened.status == 200, "the page opened no event stream"
        assert opened.request.resource_type == "eventsource"
        assert opened.headers["content-type"].startswith("text/event-stream")
        expect(page).to_have_title("(0) Inbox · Turnstile")

        turn_id = stack.ask("Transfer $12 to erin")
        row = page.locator("#inbox-rows tr[data-approval]")
        expect(row).to_have_count(1, timeout=30_000)
        assert row.get_attribute("data-approval") == f"{turn_id}:approval-1"
        expect(page).to_have_title("(1) Inbox · Turnstile")
        screenshot(page, "inbox-live-by-events")


def test_a_change_before_the_event_stream_opens_still_reloads_the_page(
    tmp_path: Path, page: Page
) -> None:
    """The resumed turn settles after the approval page rendered but before its event
    stream opened (held back here, as a slow network or a busy server would): the page
    looks once when the stream opens and shows the turn completed, without polling."""
    with (
        open_stack(tmp_path, env={"TURNSTILE_UI_POLL_SECONDS": "600"}) as stack,
        evidence(page, "sessions-sse-late"),
    ):
        turn_id = stack.ask("Transfer $21 to gus")
        approval = stack.wait_for_approval(turn_id)
        for worker in stack.workers:  # nothing may run the resume until the page is shown
            worker.terminate()
            worker.wait(timeout=30)
        # The inbox's stream starts the server's listener, so the approval page's stream
        # below joins a listener that is already up and announces nothing on its own.
        with page.expect_response(EVENTS):
            sign_in(page, stack.base, "bob")
        held: list[Route] = []
        page.route(EVENTS, lambda route: held.append(route))
        page.goto(f"{stack.base}/ui/approvals/{approval['id']}")
        page.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
        page.get_by_role("button", name="Submit decision").click()
        expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")
        result = page.locator("section.result")
        expect(result).to_contain_text("queued or running")

        with worker_process(stack.db_url, env=stack.env):
            eventually(stack.transfers, timeout=30, what="the resumed turn's transfer")
        # Playwright's sync API runs a route's handler only while the test calls into it, so
        # the held stream may not be in the list yet: give it a moment through Playwright.
        for _ in range(100):
            if held:
                break
            page.wait_for_timeout(50)
        assert held, "the page opened no event stream"
        for route in held:
            route.continue_()
        page.unroute(EVENTS)
        expect(result).to_contain_text("completed", timeout=15_000)


def test_on_sqlite_the_page_falls_back_to_polling(tmp_path: Path, page: Page) -> None:
    """SQLite cannot announce changes: the stream answers 204, the page's EventSource gives
    up, and the inbox still shows a new approval by polling."""
    with (
        open_stack(
            tmp_path,
            env={"TURNSTILE_UI_SECRET": "polling-acceptance-secret-0123456789abcdef"},
            worker=False,
            serve_workers=1,
            database="sqlite",
        ) as stack,
        evidence(page, "sessions-polling"),
    ):
        with page.expect_response(lambda r: "/ui/events" in r.url) as stream:
            sign_in(page, stack.base, "bob")
        assert stream.value.status == 204
        with page.expect_response(lambda r: "/ui/inbox/live" in r.url):
            pass  # the page polls once the stream is refused
        stack.ask("Transfer $9 to fay")
        expect(page.locator("#inbox-rows tr[data-approval]")).to_have_count(1, timeout=30_000)
        expect(page).to_have_title("(1) Inbox · Turnstile")


def test_failed_sign_ins_are_limited_across_two_server_processes(tmp_path: Path) -> None:
    """Failures spread over two server processes sharing a database count together: past
    the limit both answer 429 with Retry-After, even to the right token, and say so in
    their metrics."""
    settings = {"TURNSTILE_UI_SECRET": "limits-acceptance-secret-0123456789abcdef"}
    args = ["--auth", AUTH_SPEC]
    with (
        postgres_url() as url,
        serve_process(url, args=args, env=settings, log=tmp_path / "a.log") as (first, _a),
        serve_process(url, args=args, env=settings, log=tmp_path / "b.log") as (second, _b),
    ):
        answers = [
            _sign_in_over_http(base, "wrong-token")
            for base in (first, second, first, second, first)
        ]
        assert [a.status_code for a in answers] == [401] * 5
        for base in (first, second):
            limited = _sign_in_over_http(base, TOKENS["bob"])
            assert limited.status_code == 429, limited.text
            assert 1 <= int(limited.headers["retry-after"]) <= 300
            assert "Too many failed sign-ins" in limited.text
        metrics = httpx.get(f"{first}/metrics").text
        assert 'turnstile_ui_login_failures_total{reason="refused"} 3.0' in metrics
        assert 'turnstile_ui_login_failures_total{reason="limited"} 1.0' in metrics


def test_a_forged_forwarded_for_does_not_escape_the_sign_in_limit(tmp_path: Path) -> None:
    """Each guess claiming another ``X-Forwarded-For`` still counts against the connection's
    address: the sixth is limited. Naming the sender with ``--forwarded-allow-ips`` makes
    its header believed, so each claimed address is counted on its own."""
    settings = {"TURNSTILE_UI_SECRET": "limits-acceptance-secret-0123456789abcdef"}
    with postgres_url() as url:
        args = ["--auth", AUTH_SPEC]
        with serve_process(url, args=args, env=settings) as (base, _process):
            answers = [
                _sign_in_over_http(base, "wrong-token", forwarded=f"203.0.113.{n}")
                for n in range(1, 7)
            ]
            assert [a.status_code for a in answers] == [401] * 5 + [429]

        trusting = [*args, "--forwarded-allow-ips", "127.0.0.1"]
        with serve_process(url, args=trusting, env=settings) as (base, _process):
            answers = [
                _sign_in_over_http(base, "wrong-token", forwarded=f"198.51.100.{n}")
                for n in range(1, 7)
            ]
            assert [a.status_code for a in answers] == [401] * 6


def _sign_in_over_http(base: str, token: str, *, forwarded: str | None = None) -> httpx.Response:
    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    with httpx.Client(base_url=base, timeout=30, headers=headers) as client:
        form = client.get("/ui/login")
        found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert found is not None
        return client.post("/ui/login", data={"csrf_token": found.group(1), "token": token})
