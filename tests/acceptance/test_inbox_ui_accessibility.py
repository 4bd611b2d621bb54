"""Accessibility of the approval page's forms in a real browser at a phone's width (375 px),
against real ``turnstile serve`` and ``turnstile worker`` processes on PostgreSQL: the page
with the edit-arguments form, the assignment forms and the decision form scrolls only
vertically, every input has a label, ids are unique, the keyboard reaches every control in
the order the page shows them, each with a visible focus ring, and the edit form is submitted
from the keyboard alone."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.acceptance.inbox_ui_support import (
    Stack,
    evidence,
    open_edit_stack,
    screenshot,
    signed_in,
)

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)

PHONE: ViewportSize = {"width": 375, "height": 812}

# Every control a keyboard can reach, in document order, one per radio group (Tab enters a
# group once), each marked with its position so the Tab sequence can be compared with it.
MARK_TABBABLE = """() => {
  const selector = 'a[href], button, input:not([type=hidden]), select, textarea, [tabindex]';
  const seenGroups = new Set();
  const marked = [];
  for (const el of document.querySelectorAll(selector)) {
    if (el.disabled || el.tabIndex < 0) continue;
    if (el.type === 'radio') {
      if (seenGroups.has(el.name)) { el.dataset.a11y = 'radio:' + el.name; continue; }
      seenGroups.add(el.name);
      el.dataset.a11y = 'radio:' + el.name;
    } else {
      el.dataset.a11y = String(marked.length);
    }
    marked.push(el.dataset.a11y);
  }
  return marked;
}"""

# What the focused element is, and whether its focus can be seen.
FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const style = getComputedStyle(el);
  const ring = (style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0)
    || style.boxShadow !== 'none';
  const box = el.getBoundingClientRect();
  return {
    key: el.dataset.a11y || null,
    name: (el.getAttribute('aria-label') || el.textContent || el.name || el.id || '').trim(),
    ring: ring,
    inside: box.width > 0 && box.left >= 0 && box.right <= window.innerWidth + 0.5,
  };
}"""

UNLABELLED = """() => Array.from(document.querySelectorAll(
    'input:not([type=hidden]), select, textarea'))
  .filter(el => el.labels.length === 0 && !el.getAttribute('aria-label')
    && !el.getAttribute('aria-labelledby'))
  .map(el => el.outerHTML)"""

DUPLICATE_IDS = """() => {
  const ids = Array.from(document.querySelectorAll('[id]')).map(el => el.id);
  return ids.filter((id, i) => ids.indexOf(id) !== i);
}"""

WIDEST = """() => Array.from(document.querySelectorAll('main *'))
  .filter(el => el.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5)
  .slice(0, 5).map(el => el.tagName + '.' + el.className)"""


def phone(browser: Browser, stack: Stack, who: str, start: str) -> ContextManager[Page]:
    """A phone-width page with ``who`` signed in (by keyboard), at ``start``."""
    return signed_in(
        browser, stack, who, start, viewport=PHONE, keyboard=True, is_mobile=True, has_touch=True
    )


def tab_through(page: Page, expected: list[str]) -> list[dict[str, Any]]:
    """Press Tab from the top of the page until focus leaves the page's controls; the
    focused elements in order."""
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); }")
    page.evaluate("() => window.scrollTo(0, 0)")
    visited: list[dict[str, Any]] = []
    for _ in range(len(expected) + 5):
        page.keyboard.press("Tab")
        focused = page.evaluate(FOCUSED)
        if focused is None or (visited and focused["key"] == visited[0]["key"]):
            break
        visited.append(focused)
    return visited


def test_the_approval_page_at_phone_width(browser: Browser, tmp_path: Path) -> None:
    """At 375 px the approval page with the edit, assignment and decision forms has no
    horizontal scroll, labels on every input and unique ids; Tab visits every control once in
    document order (the decision box — approve, the edit form, reject, answer in its place —
    then the assignment) with a visible ring, and Enter in the edited amount approves with the
    edit."""
    with open_edit_stack(tmp_path, secret="a11y-ui-acceptance-secret-0123456789abcdefgh") as stack:
        turn_id = stack.ask("Transfer $40 to carol")
        approval = stack.wait_for_approval(turn_id, who="alice")
        start = f"/ui/approvals/{approval['id']}"

        with phone(browser, stack, "bob", start) as page, evidence(page, "a11y-phone"):
            expect(page.locator("form#edit-form")).to_be_visible()
            expect(page.get_by_role("button", name="Claim it")).to_be_visible()
            expect(page.get_by_label("Person")).to_be_visible()
            screenshot(page, "approval-phone")

            sizes = page.evaluate(
                "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            assert sizes[0] <= sizes[1], f"scrolls sideways: {sizes}, {page.evaluate(WIDEST)}"
            assert page.evaluate(UNLABELLED) == []
            assert page.evaluate(DUPLICATE_IDS) == []
            assert page.locator("[tabindex]:not([tabindex='-1']):not([tabindex='0'])").count() == 0
            for name in (
                "Approve",
                "Edit the arguments, then approve",
                "Reject",
                "Or answer in its place",
                "Assign",
            ):
                expect(page.get_by_role("form", name=name, exact=True)).to_be_visible()

            expected = page.evaluate(MARK_TABBABLE)
            visited = tab_through(page, expected)
            assert [v["key"] for v in visited] == expected, "Tab skips or reorders controls"
            hidden = [v["name"] for v in visited if not (v["ring"] and v["inside"])]
            assert hidden == [], f"focus not visible on: {hidden}"
            names = [v["name"] for v in visited]
            edit = names.index("Approve with these arguments")
            assert names.index("Approve") < edit < names.index("Reject")
            assert names.index("Reject") < names.index("Submit decision") < names.index("Claim it")

            amount = page.locator("form#edit-form").get_by_label(re.compile("Amount"))
            amount.focus()
            page.keyboard.press("Control+A")
            page.keyboard.type("75")
            page.keyboard.press("Enter")
            expect(page.get_by_role("status").first).to_contain_text("Your decision was recorded.")
            diff = page.get_by_role("table", name=re.compile("Arguments edited by bob"))
            expect(diff.get_by_role("row", name=re.compile("amount"))).to_contain_text("75")
