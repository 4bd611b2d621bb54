"""``GET /ui/events`` over real HTTP: a change in the store reaches an open stream as a
``change`` event (in memory and through PostgreSQL's notifications), SQLite answers 204 so
pages poll, and a browser that is not signed in gets 401."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from engine.memory_store import InMemorySessionStore
from engine.remote import BearerTokenAuth, Principal, create_app
from engine.remote.ui import UiSettings
from engine.store import SessionStore
from examples.banking import BankingApp, build
from tests.databases import sql_store
from tests.http_support import serve_in_loop

SETTINGS = UiSettings(secret="events-test-secret-0123456789abcdef", poll_seconds=1)


@pytest.fixture(params=["memory", "postgres"])
async def notifying_store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    """A store that announces changes: in memory, or PostgreSQL (LISTEN/NOTIFY)."""
    if request.param == "memory":
        yield InMemorySessionStore()
        return
    async with sql_store("postgres") as store:
        yield store


async def next_event(lines: AsyncIterator[str], timeout: float) -> str:
    """The name of the next event on the stream (comments and data skipped)."""

    async def read() -> str:
        async for line in lines:
            if line.startswith("event: "):
                return line.removeprefix("event: ")
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(read(), timeout)


async def test_a_new_turn_is_announced_on_the_stream(notifying_store: SessionStore) -> None:
    """An open stream receives a change event when a turn is created elsewhere."""
    app: BankingApp = build(store=notifying_store, execution="workers")
    asgi = create_app(app.ai, ui_settings=SETTINGS)
    async with (
        serve_in_loop(asgi) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
        client.stream("GET", "/ui/events") as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert "default-src 'none'" in stream.headers["content-security-policy"]
        lines = stream.aiter_lines()
        assert await next_event(lines, 5) == "ready"
        await app.banking_agent.chat().send("Transfer $20 to alice", wait=False)
        assert await next_event(lines, 5) == "change"


async def test_sqlite_answers_no_content_so_pages_poll() -> None:
    """Without notifications the stream is refused with 204: EventSource stops, pages poll."""
    async with sql_store("sqlite") as store:
        app = build(store=store, execution="workers")
        async with (
            serve_in_loop(create_app(app.ai, ui_settings=SETTINGS)) as base,
            httpx.AsyncClient(base_url=base) as client,
        ):
            assert (await client.get("/ui/events")).status_code == 204


async def test_the_stream_needs_a_signed_in_browser() -> None:
    """A browser that has not signed in gets 401 JSON, as the pages' other live reads do."""
    auth = BearerTokenAuth({"t": Principal(id="alice")})
    app = build(store=InMemorySessionStore())
    async with (
        serve_in_loop(create_app(app.ai, auth=auth, ui_settings=SETTINGS)) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        refused = await client.get("/ui/events")
        assert refused.status_code == 401 and refused.json()["status"] == "UNAUTHENTICATED"
