"""A link to the inbox followed from another site keeps the approver signed in, in a real
browser against a real ``turnstile serve`` (issue 31, item 2).

With ``SameSite=Strict`` the browser holds the session cookie back from a request another
site's page started; the server must not answer it with a new anonymous cookie, which would
replace the session's and sign the approver out. The other site here is ``localhost``, the
server ``127.0.0.1``: two sites to the browser.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.acceptance.inbox_ui_support import open_stack, signed_in

pytestmark = pytest.mark.postgres
expect.set_options(timeout=15_000)


@contextlib.contextmanager
def another_site(link: str) -> Iterator[str]:
    """A page on ``http://localhost:<port>/`` holding one link to ``link``."""
    page = f'<!doctype html><title>Mail</title><a id="go" href="{link}">Your approval</a>'

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_link_from_another_site_keeps_the_approver_signed_in(
    browser: Browser, tmp_path: Path
) -> None:
    """bob, signed in, follows a link to /ui from another site's page: the inbox opens
    signed in, and he is still signed in on his next visit."""
    with open_stack(tmp_path, worker=False) as stack, signed_in(browser, stack, "bob") as page:
        with another_site(f"{stack.base}/ui") as mail:
            page.goto(mail)
            page.locator("#go").click()
            page.wait_for_url(f"{stack.base}/ui")
            expect(page.get_by_role("heading", level=1)).to_contain_text("Inbox")
            expect(page.get_by_text("Signed in as bob")).to_be_visible()
        page.goto(f"{stack.base}/ui")
        expect(page.get_by_role("heading", level=1)).to_contain_text("Inbox")
