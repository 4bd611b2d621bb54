"""The runs page (``/ui/runs``) in Debian's Chromium against real ``turnstile serve`` and
``turnstile worker`` processes on PostgreSQL: a failed turn is found by the first characters
of its id and its row opens the turn inspector; a requester sees only her own turns, whatever
requester she names; an operator sees everyone's and narrows them by status, agent and
requester; pages follow a sealed cursor, and an altered cursor or a malformed filter is a 400
in plain words."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.acceptance.inbox_ui_support import (
    Stack,
    eventually,
    evidence,
    open_stack,
    screenshot,
    signed_in,
)
from tests.acceptance.test_inbox_ui_accessibility import DUPLICATE_IDS, PHONE, UNLABELLED

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One server and worker for the module's tests (each test reads, none writes)."""
    with open_stack(tmp_path_factory.mktemp("runs")) as opened:
        yield opened


@pytest.fixture(scope="module")
def turns(stack: Stack) -> dict[str, str]:
    """Alice's failed turn and her answered one, and Mallory's, once the worker ran them."""
    ids = {
        "failed": stack.ask("please fail", who="alice"),
        "hello": stack.ask("hello there", who="alice"),
        "mallory": stack.ask("hello from mallory", who="mallory"),
    }
    for name, turn_id in ids.items():
        who = "mallory" if name == "mallory" else "alice"

        def settled(turn_id: str = turn_id, who: str = who) -> bool:
            return stack.snapshot(turn_id, who=who).get("status") in ("completed", "failed")

        eventually(settled, timeout=30, what=f"turn {name} to settle")
    return ids


def listed(page: Page) -> list[str]:
    """The turn ids the runs table shows, in order."""
    return list(
        page.locator("#runs tbody tr[data-turn-id]").evaluate_all(
            "rows => rows.map(row => row.dataset.turnId)"
        )
    )


def test_a_failed_turn_is_found_by_its_id_prefix_and_opens_the_inspector(
    browser: Browser, stack: Stack, turns: dict[str, str]
) -> None:
    """Alice types the first eight characters of her failed turn's id: one row, failed, whose
    link opens that turn's page; the page has a label on every input and unique ids."""
    failed = turns["failed"]
    with signed_in(browser, stack, "alice") as page, evidence(page, "runs-prefix"):
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs").click()
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        assert page.evaluate(UNLABELLED) == [] and page.evaluate(DUPLICATE_IDS) == []
        page.get_by_label("Turn id starts with").fill(failed[:8])
        page.get_by_role("button", name="Find").click()
        expect(page.locator("#runs tbody tr[data-turn-id]")).to_have_count(1)
        row = page.locator(f'#runs tr[data-turn-id="{failed}"]')
        expect(row.locator('td[data-label="Status"]')).to_have_text("failed")
        expect(row.locator('td[data-label="About"]')).to_contain_text("Scripted model failure")
        row.get_by_role("link", name=failed).click()
        page.wait_for_url(f"**/ui/turns/{failed}")
        expect(page.get_by_role("heading", name=f"Turn {failed}")).to_be_visible()


def test_a_requester_sees_only_her_own_turns(
    browser: Browser, stack: Stack, turns: dict[str, str]
) -> None:
    """Mallory sees her turn and none of Alice's, also when she names Alice as requester or
    searches Alice's id; the requester field is not offered to her."""
    with signed_in(browser, stack, "mallory", "/ui/runs") as page, evidence(page, "runs-own"):
        assert listed(page) == [turns["mallory"]]
        expect(page.get_by_label("Requested by")).to_have_count(0)
        page.goto(f"{stack.base}/ui/runs?requester=alice")
        assert listed(page) == [turns["mallory"]]
        page.goto(f"{stack.base}/ui/runs?q={turns['failed']}")
        assert listed(page) == []
        expect(page.locator("#runs tr.empty")).to_have_text("No runs match these filters.")


def test_an_operator_sees_every_turn_and_narrows_them(
    browser: Browser, stack: Stack, turns: dict[str, str]
) -> None:
    """Bob (an approver) sees every requester's turns; status, agent and requester filters
    each narrow the list."""
    with signed_in(browser, stack, "bob", "/ui/runs") as page, evidence(page, "runs-operator"):
        assert set(turns.values()) <= set(listed(page))
        screenshot(page, "runs")
        page.get_by_label("Status").select_option("failed")
        page.get_by_role("button", name="Find").click()
        page.wait_for_url("**status=failed**")
        assert listed(page) == [turns["failed"]]
        page.get_by_label("Agent").select_option(stack.agent)
        page.get_by_role("button", name="Find").click()
        page.wait_for_url(f"**agent={stack.agent}**")
        assert listed(page) == [turns["failed"]]
        page.goto(f"{stack.base}/ui/runs?requester=mallory")
        assert listed(page) == [turns["mallory"]]
        expect(page.get_by_label("Requested by")).to_have_value("mallory")


def test_pages_follow_the_cursor_and_an_altered_cursor_is_refused(
    browser: Browser, stack: Stack, turns: dict[str, str]
) -> None:
    """With more turns than a page holds, Next page shows the rest, none twice and none
    missed; a cursor altered by one character and a malformed filter are 400s in words."""
    more = [stack.ask(f"hello {n}", who="alice") for n in range(50)]
    with signed_in(browser, stack, "alice", "/ui/runs") as page, evidence(page, "runs-pages"):
        first = listed(page)
        assert len(first) == 50
        next_link = page.get_by_role("link", name="Next page")
        cursor_url = str(next_link.get_attribute("href"))
        next_link.click()
        page.wait_for_url("**cursor=**")
        second = listed(page)
        assert not set(first) & set(second)
        assert set(first) | set(second) == {*more, turns["failed"], turns["hello"]}
        expect(page.get_by_role("link", name="Next page")).to_have_count(0)
        expect(page.get_by_role("link", name="First page")).to_be_visible()

        cookies = {c["name"]: c["value"] for c in page.context.cookies()}
        with httpx.Client(base_url=stack.base, cookies=cookies) as client:
            head, cursor = cursor_url.split("cursor=")
            altered = cursor[:10] + ("A" if cursor[10] != "A" else "B") + cursor[11:]
            refused = client.get(f"{head}cursor={altered}")
            assert refused.status_code == 400
            assert "The page cursor is not one this server handed out." in refused.text
            for bad in ("age=soon", "age=" + "9" * 40, "status=sleeping", "q=" + "x" * 5000):
                answer = client.get(f"/ui/runs?{bad}")
                assert answer.status_code == 400, (bad, answer.status_code)


def test_the_runs_page_fits_a_phone(browser: Browser, stack: Stack, turns: dict[str, str]) -> None:
    """At a phone's width (375 px) the runs page scrolls only vertically and its rows still
    link their turns (the newest first: Alice's and Mallory's, then any added since)."""
    with (
        signed_in(browser, stack, "bob", "/ui/runs", viewport=PHONE) as page,
        evidence(page, "runs-phone"),
    ):
        # The table's header row is hidden off-screen at this width (each cell labels itself),
        # so what counts is whether the page itself scrolls sideways.
        assert page.evaluate(
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )
        shown = listed(page)
        assert turns["mallory"] in shown or len(shown) == 50
        for turn_id in shown[:3]:
            expect(page.get_by_role("link", name=turn_id)).to_be_visible()
        screenshot(page, "runs-phone")
