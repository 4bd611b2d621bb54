"""Approvals in the approver's words, against real ``turnstile serve`` and ``turnstile worker``
processes on PostgreSQL with a real browser: the banking example declares its approval's title
and summary (``title="Transfer approval"``, ``summary="{details}"``), and the inbox row, the
approval page, the JSON inbox, ``turnstile approvals ls`` at 80 columns and the history CSV
all lead with what is asked, keeping the code name ``userApproval`` for the details."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.acceptance.inbox_ui_support import Stack, open_stack, screenshot, sign_in
from tests.acceptance.test_cli_tables import in_terminal

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)

ASKED = "Transfer $250 to rent"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with open_stack(tmp_path) as opened:
        yield opened


def test_every_listing_leads_with_the_declared_summary(stack: Stack, page: Page) -> None:
    """The inbox row and the approval page lead with the summary and title, the code name is
    only in the page's details, the JSON inbox carries both, the CLI table shows the summary
    at 80 columns, and the history CSV says what was approved."""
    turn_id = stack.ask(ASKED)
    approval = stack.wait_for_approval(turn_id)
    assert (approval["title"], approval["summary"]) == ("Transfer approval", ASKED)
    assert approval["interrupt"] == "userApproval"  # the code name stays on the wire

    sign_in(page, stack.base, "bob")
    row = page.locator("#inbox-rows tr[data-approval]")
    expect(row).to_have_count(1)
    expect(row.locator(".approval-name")).to_have_text(ASKED)
    expect(row).to_contain_text("Transfer approval")
    expect(row).not_to_contain_text("userApproval")
    screenshot(page, "wording-inbox")

    row.get_by_role("link").click()
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_contain_text(ASKED)
    expect(heading).not_to_contain_text("userApproval")
    expect(page).to_have_title(re.compile(re.escape(ASKED)))
    expect(page.locator(".approval-subline")).to_have_text("Transfer approval")
    expect(page.locator(".facts .code-name")).to_have_text("userApproval")
    screenshot(page, "wording-approval")

    lines = in_terminal(stack.db_url, "approvals", "ls", "--app", "examples.banking:ai")
    assert all(len(line) <= 80 for line in lines), lines
    assert any(ASKED in line for line in lines), lines
    assert not any("userApproval" in line for line in lines), lines
    shown = in_terminal(
        stack.db_url, "approvals", "show", str(approval["id"]), "--app", "examples.banking:ai"
    )
    assert re.fullmatch(r"asks\s+Transfer \$250 to rent", shown[0].rstrip()), shown
    assert re.fullmatch(r"title\s+Transfer approval", shown[1].rstrip()), shown

    page.get_by_role("group", name=re.compile("Approved")).get_by_label("Yes").check()
    page.get_by_role("button", name="Submit decision").click()
    expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")

    exported = page.context.request.get(f"{stack.base}/ui/history.csv")
    assert exported.status == 200
    [entry] = list(csv.DictReader(io.StringIO(exported.text())))
    assert (entry["interrupt"], entry["summary"]) == ("userApproval", ASKED)
