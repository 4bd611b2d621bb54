"""``GET /ui/events`` over real HTTP: a change in the store reaches an open stream as a
``change`` event (in memory and through PostgreSQL's notifications), also a quorum vote and an
assignment change that leave every turn's status as it was; SQLite answers 204 so pages poll,
and a browser that is not signed in gets 401."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from engine.approval_policy import ApprovalPolicy, role
from engine.approvals.assignment import claim
from engine.approvals.decide import Decision, decide, find_approval
from engine.conversation.parts import Message
from engine.remote import BearerTokenAuth, Principal, create_app
from engine.remote.ui import UiSettings
from engine.status import FinishReason
from engine.store import PendingApproval, SessionStore, TurnInput
from engine.store.memory import InMemorySessionStore
from engine.turns.request import TurnRequest
from examples.banking import BankingApp, build
from tests.conftest import TEST_STATE_KEYS
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


APPROVERS = frozenset({"approver"})


async def paused_for_two_approvals(store: SessionStore) -> tuple[BankingApp, PendingApproval]:
    """alice's transfer paused at an approval that needs two approvers."""
    app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
    app.user_approval.approval_policy = ApprovalPolicy(
        approvers=role("approver"), required_approvals=2
    )
    response = await app.banking_agent.run_turn(
        TurnRequest(
            input=TurnInput(kind="message", message=Message.user("transfer $40 to carol")),
            owner="alice",
        )
    )
    assert response.finish_reason is FinishReason.INTERRUPTED and response.snapshot_id
    found = await find_approval(store, response.snapshot_id, "approval-1")
    assert found is not None and found[1]
    return app, found[0]


async def read_events(stream: httpx.Response, into: asyncio.Queue[str]) -> None:
    """Put the name of every event on ``stream`` into ``into``."""
    async for line in stream.aiter_lines():
        if line.startswith("event: "):
            await into.put(line.removeprefix("event: "))


async def settle(events: asyncio.Queue[str], quiet: float = 1.5) -> None:
    """Drop events until none came for ``quiet`` seconds (the stream's first look, and the
    listener's own wake-up when it connects, are announced as changes)."""
    while True:
        try:
            await asyncio.wait_for(events.get(), quiet)
        except TimeoutError:
            return


@pytest.mark.parametrize("change", ["vote", "claim"])
async def test_a_vote_or_a_claim_is_announced_on_the_stream(
    notifying_store: SessionStore, change: str
) -> None:
    """A quorum vote that does not decide, and a claim, change no turn's status, yet an open
    stream receives a change event, so other open inbox pages show the new count or holder."""
    app, approval = await paused_for_two_approvals(notifying_store)
    asgi = create_app(app.ai, ui_settings=SETTINGS)
    events: asyncio.Queue[str] = asyncio.Queue()
    async with (
        serve_in_loop(asgi) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
        client.stream("GET", "/ui/events") as stream,
    ):
        reader = asyncio.create_task(read_events(stream, events))
        try:
            assert await asyncio.wait_for(events.get(), 5) == "ready"
            await settle(events)
            bob = Principal("bob", roles=APPROVERS)
            if change == "vote":
                outcome = await decide(
                    app.banking_agent,
                    approval,
                    Decision(respond={"approved": True}),
                    decided_by="bob",
                    approver=bob,
                )
                assert not outcome.is_decided, "one vote of two must not decide"
            else:
                await claim(app.banking_agent, approval, bob)
            assert await asyncio.wait_for(events.get(), 5) == "change"
        finally:
            reader.cancel()


async def test_a_stream_hears_only_of_turns_its_viewer_may_see(
    notifying_store: SessionStore,
) -> None:
    """Under the default policy (a principal sees the turns of their own sessions), Bob's
    stream stays silent while Alice's transfer runs and pauses, and announces Bob's own."""
    tokens = {"tok-alice": Principal("alice"), "tok-bob": Principal("bob")}
    app = build(store=notifying_store, state_keys=TEST_STATE_KEYS, execution="inline")
    asgi = create_app(app.ai, auth=BearerTokenAuth(tokens), ui_settings=SETTINGS)
    events: asyncio.Queue[str] = asyncio.Queue()
    async with (
        serve_in_loop(asgi) as base,
        httpx.AsyncClient(base_url=base, timeout=30) as browser,
        httpx.AsyncClient(base_url=base, timeout=30) as api,
    ):
        login = await browser.get("/ui/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', login.text)
        assert csrf is not None
        signed = await browser.post("/ui/login", data={"csrf_token": csrf[1], "token": "tok-bob"})
        assert signed.status_code == 303
        async with browser.stream("GET", "/ui/events") as stream:
            reader = asyncio.create_task(read_events(stream, events))
            try:
                assert await asyncio.wait_for(events.get(), 5) == "ready"
                await settle(events)
                for who in ("alice", "bob"):
                    paused = await api.post(
                        "/api/bankingAgent",
                        json={"data": {"message": Message.user("transfer $7 to x").to_wire()}},
                        headers={"authorization": f"Bearer tok-{who}"},
                    )
                    assert paused.json()["result"]["finishReason"] == "interrupted", paused.text
                    if who == "alice":
                        with pytest.raises(TimeoutError):
                            await asyncio.wait_for(events.get(), 1.5)
                assert await asyncio.wait_for(events.get(), 5) == "change"
            finally:
                reader.cancel()
