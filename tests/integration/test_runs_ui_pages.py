"""The runs page (``/ui/runs``) over real HTTP (uvicorn in the test's loop), without a
browser: what it lists and finds on an open server over the in-memory store, who sees whose
turns behind bearer tokens on SQLite, and a 400 in words for every malformed filter."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from engine.remote import RoleInboxPolicy, create_app
from examples.banking import BankingApp, build
from tests.databases import sql_store
from tests.http_support import serve_in_loop
from tests.integration import test_inbox_ui_pages as inbox_pages
from tests.integration.test_inbox_ui_pages import AUTH, SETTINGS, TOKENS, signed_in

#: The inbox pages' open server: the banking example in memory, run inline, no authenticator.
open_server = inbox_pages.open_server


def listed(html: str) -> list[str]:
    """The turn ids of the runs table, in order."""
    return re.findall(r'<tr data-turn-id="([^"]+)"', html)


async def test_the_runs_page_lists_and_finds_turns(
    open_server: tuple[BankingApp, httpx.AsyncClient],
) -> None:
    """Every turn is listed newest first; the paused one says so and what it asks; an id
    prefix, the paused status and an unknown agent each narrow the list."""
    app, client = open_server
    paused = str((await app.banking_agent.chat().send("Transfer $20 to alice")).snapshot_id)
    hello = str((await app.banking_agent.chat().send("hello")).snapshot_id)
    page = await client.get("/ui/runs")
    assert page.status_code == 200
    assert listed(page.text) == [hello, paused]
    assert "paused (waiting for approval)" in page.text and "userApproval" in page.text

    found = await client.get("/ui/runs", params={"q": hello[:6]})
    assert listed(found.text) == [hello]
    waiting = await client.get("/ui/runs", params={"status": "paused"})
    assert listed(waiting.text) == [paused]
    nobody = await client.get("/ui/runs", params={"agent": "noSuchAgent"})
    assert listed(nobody.text) == [] and "No runs match these filters." in nobody.text


async def test_malformed_filters_are_400s_in_words(
    open_server: tuple[BankingApp, httpx.AsyncClient],
) -> None:
    """A status, age, id search, version or cursor the page cannot take is a 400 naming it."""
    _app, client = open_server
    cases = {
        "status=sleeping": "status must be one of",
        "age=-5": "age must be a number of seconds",
        "age=" + "9" * 30: "age must be between 0 and ten years",
        "q=a%00b": "The id search holds a NUL character",
        "q=" + "x" * 5000: "The id search is too long",
        "version=" + "v" * 5000: "The version filter is too long",
        "cursor=not-a-cursor": "The page cursor is not one this server handed out.",
    }
    for query, words in cases.items():
        answer = await client.get(f"/ui/runs?{query}")
        assert answer.status_code == 400, (query, answer.status_code)
        assert words in answer.text, (query, answer.text[-500:])


@pytest.fixture
async def queued_server() -> AsyncIterator[str]:
    """The banking example on SQLite, its turns queued for workers (none run), behind bearer
    tokens, approvers by role; Alice asked twice and Mallory once."""
    async with sql_store("sqlite") as store:
        app = build(store=store, execution="workers")
        served = create_app(
            app.ai, auth=AUTH, inbox_policy=RoleInboxPolicy("approver"), ui_settings=SETTINGS
        )
        async with serve_in_loop(served) as base:
            yield base


async def _ask(base: str, who: str, text: str) -> str:
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {TOKENS[who]}"}
    ) as api:
        message = {"role": "user", "content": [{"text": text}]}
        started = await api.post(
            "/api/bankingAgent", json={"data": {"message": message, "detach": True}}
        )
    return str(started.json()["result"]["snapshotId"])


async def test_a_requester_sees_her_own_runs_and_an_operator_everyones(
    queued_server: str,
) -> None:
    """Mallory sees only her turn, also when she names Alice or searches Alice's id; Bob (an
    approver) sees every turn and narrows them to one requester's."""
    base = queued_server
    alices = [await _ask(base, "alice", "hello"), await _ask(base, "alice", "hi")]
    mallorys = await _ask(base, "mallory", "hello")
    mallory, bob = await signed_in(base, "mallory"), await signed_in(base, "bob")
    try:
        own = await mallory.get("/ui/runs")
        assert listed(own.text) == [mallorys] and "Turns of your own sessions" in own.text
        assert 'name="requester"' not in own.text
        named = await mallory.get("/ui/runs", params={"requester": "alice"})
        assert listed(named.text) == [mallorys]
        searched = await mallory.get("/ui/runs", params={"q": alices[0]})
        assert listed(searched.text) == []

        everyone = await bob.get("/ui/runs")
        assert set(listed(everyone.text)) == {*alices, mallorys}
        narrowed = await bob.get("/ui/runs", params={"requester": "alice"})
        assert listed(narrowed.text) == list(reversed(alices))
    finally:
        await mallory.aclose()
        await bob.aclose()
