"""Browser sessions of the inbox UI over real HTTP (uvicorn in the test's loop): a cookie
stops working once its session is revoked, idle or expired, and failed sign-ins are limited
per client address and per account, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from engine.remote import BearerTokenAuth, Principal, RoleInboxPolicy, create_app
from engine.remote.ui import UiSettings
from engine.remote.ui.browser_sessions import BrowserSessionStore, InMemoryBrowserSessions
from engine.remote.ui.sessions import COOKIE_NAME
from engine.store.memory import InMemorySessionStore
from examples.banking import build
from stores.ui_sessions import SqlBrowserSessions
from tests.databases import sql_store
from tests.http_support import csrf_of, serve_in_loop

TOKENS = {"alice": "alice-token", "bob": "bob-token"}
AUTH = BearerTokenAuth(
    {
        TOKENS["alice"]: Principal(id="alice"),
        TOKENS["bob"]: Principal(id="bob", roles=frozenset({"approver"})),
    }
)
SETTINGS = UiSettings(
    secret="sessions-test-secret-0123456789abcdef",
    poll_seconds=1,
    idle_seconds=600,
    login_limit=3,
)


@pytest.fixture(params=["sqlite", "postgres"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, BrowserSessionStore]]:
    """The banking example on a fresh SQL database, behind bearer tokens; yields the base URL
    and the store keeping the browser sessions."""
    async with sql_store(request.param) as store:
        app = build(store=store, execution="workers")
        sessions = SqlBrowserSessions(store.db)
        asgi = create_app(
            app.ai,
            auth=AUTH,
            inbox_policy=RoleInboxPolicy("approver"),
            ui_settings=replace(SETTINGS, session_store=sessions),
        )
        async with serve_in_loop(asgi) as base:
            yield base, sessions


async def sign_in(
    client: httpx.AsyncClient, token: str, *, account: str = "", address: str = "10.9.9.9"
) -> httpx.Response:
    """Post the login form as a browser would (from ``address``, through a local proxy)."""
    headers = {"X-Forwarded-For": address}
    login = await client.get("/ui/login", headers=headers)
    return await client.post(
        "/ui/login",
        data={"csrf_token": csrf_of(login.text), "token": token, "account": account},
        headers=headers,
    )


async def test_a_logged_out_cookie_replayed_is_refused(
    served: tuple[str, BrowserSessionStore],
) -> None:
    """After logout, a copy of the session cookie taken before gets the login page (pages)
    and 401 (the pages' JSON), and the session row is revoked."""
    base, store = served
    async with httpx.AsyncClient(base_url=base) as browser:
        assert (await sign_in(browser, TOKENS["bob"])).status_code == 303
        stolen = browser.cookies[COOKIE_NAME]
        inbox = await browser.get("/ui")
        assert "Signed in as <strong>bob</strong>" in inbox.text
        (row,) = await store.list_browser_sessions(principal="bob")
        assert row.client_address == "10.9.9.9"
        out = await browser.post("/ui/logout", data={"csrf_token": csrf_of(inbox.text)})
        assert out.status_code == 303
    async with httpx.AsyncClient(base_url=base, cookies={COOKIE_NAME: stolen}) as thief:
        page = await thief.get("/ui")
        assert page.status_code == 303 and page.headers["location"].startswith("/ui/login")
        live = await thief.get("/ui/inbox/live")
        assert live.status_code == 401 and live.json()["status"] == "UNAUTHENTICATED"
    ended = await store.get_browser_session(row.id)
    assert ended is not None and ended.revoked_at is not None


async def test_an_operator_revoke_ends_every_session_of_a_principal_at_once(
    served: tuple[str, BrowserSessionStore],
) -> None:
    """Revoking a principal's sessions in the store signs out its browsers on their next
    request, while another principal's session goes on."""
    base, store = served
    async with (
        httpx.AsyncClient(base_url=base) as bob_one,
        httpx.AsyncClient(base_url=base) as bob_two,
        httpx.AsyncClient(base_url=base) as alice,
    ):
        for client, who in ((bob_one, "bob"), (bob_two, "bob"), (alice, "alice")):
            assert (await sign_in(client, TOKENS[who])).status_code == 303
        assert (await bob_one.get("/ui")).status_code == 200
        revoked = await store.revoke_browser_sessions(now=datetime.now(UTC), principal="bob")
        assert len(revoked) == 2
        for client in (bob_one, bob_two):
            assert (await client.get("/ui")).status_code == 303
        assert (await alice.get("/ui")).status_code == 200


async def test_an_idle_session_ends() -> None:
    """A session unused for longer than the idle limit is refused, though not expired."""
    sessions = InMemoryBrowserSessions()
    app = build(store=InMemorySessionStore())
    settings = replace(SETTINGS, idle_seconds=60, session_store=sessions)
    asgi = create_app(app.ai, auth=AUTH, ui_settings=settings)
    async with serve_in_loop(asgi) as base, httpx.AsyncClient(base_url=base) as browser:
        assert (await sign_in(browser, TOKENS["alice"])).status_code == 303
        assert (await browser.get("/ui")).status_code == 200
        (row,) = await sessions.list_browser_sessions(principal="alice")
        long_ago = datetime.now(UTC) - timedelta(seconds=61)
        sessions._browser_sessions[row.id] = replace(row, last_seen_at=long_ago)
        assert (await browser.get("/ui")).status_code == 303


async def test_failures_from_one_address_are_limited_with_retry_after(
    served: tuple[str, BrowserSessionStore],
) -> None:
    """Past the limit, an address gets 429 with Retry-After, even with a good token, while
    another address still signs in."""
    base, _store = served
    async with httpx.AsyncClient(base_url=base) as client:
        for _ in range(SETTINGS.login_limit):
            refused = await sign_in(client, "wrong", address="10.0.0.1")
            assert refused.status_code == 401, refused.text
        limited = await sign_in(client, TOKENS["bob"], address="10.0.0.1")
        assert limited.status_code == 429
        assert 1 <= int(limited.headers["retry-after"]) <= SETTINGS.login_window_seconds
        assert "Too many failed sign-ins" in limited.text
        assert (await sign_in(client, TOKENS["bob"], address="10.0.0.2")).status_code == 303


async def test_failures_naming_an_account_are_limited_from_any_address(
    served: tuple[str, BrowserSessionStore],
) -> None:
    """Failures naming one account, spread over addresses, lock that account; a good token of
    another account is refused when a named account does not match it."""
    base, _store = served
    async with httpx.AsyncClient(base_url=base) as client:
        for number in range(SETTINGS.login_limit):
            refused = await sign_in(client, "wrong", account="bob", address=f"10.1.0.{number}")
            assert refused.status_code == 401
        limited = await sign_in(client, TOKENS["bob"], account="bob", address="10.1.1.1")
        assert limited.status_code == 429
        mismatch = await sign_in(client, TOKENS["alice"], account="carol", address="10.1.1.2")
        assert mismatch.status_code == 401


async def test_a_success_resets_the_accounts_counter(
    served: tuple[str, BrowserSessionStore],
) -> None:
    """After a successful sign-in, the account's earlier failures no longer count."""
    base, _store = served
    async with httpx.AsyncClient(base_url=base) as client:
        for _ in range(SETTINGS.login_limit - 1):
            refused = await sign_in(client, "wrong", account="alice", address="10.2.0.1")
            assert refused.status_code == 401
        ok = await sign_in(client, TOKENS["alice"], account="alice", address="10.2.0.1")
        assert ok.status_code == 303
    async with httpx.AsyncClient(base_url=base) as other:
        for _ in range(SETTINGS.login_limit):
            refused = await sign_in(other, "wrong", account="alice", address="10.2.0.2")
            assert refused.status_code == 401, "the account's count started again"
        limited = await sign_in(other, "wrong", account="alice", address="10.2.0.3")
        assert limited.status_code == 429
