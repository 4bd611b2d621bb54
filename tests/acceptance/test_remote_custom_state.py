"""The Python remote client exposes custom state and artifacts like the local API.

``tests.acceptance.state_app`` is served two ways: by a real ``turnstile serve`` process on
PostgreSQL with an embedded worker pool (chunks relayed from the worker), and in this process
on an in-memory store (turns run by the server itself); ``engine.remote.client.remote_agent``
talks to each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from engine.remote import create_app
from engine.remote.client import remote_agent
from stores import InMemorySessionStore
from tests.acceptance.state_app import build
from tests.databases import postgres_url
from tests.http_support import serve_in_loop, serve_process


@pytest.fixture(scope="module")
def served_process() -> Iterator[str]:
    with (
        postgres_url() as url,
        serve_process(url, app="tests.acceptance.state_app:ai", workers=2) as (base, _),
    ):
        yield base


@pytest.fixture(params=["postgres-workers", "memory-in-process"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The base URL of one of the two servers."""
    if request.param == "postgres-workers":
        yield request.getfixturevalue("served_process")
        return
    ai = build(InMemorySessionStore(), state_keys={"k": "in-process-test-key-0123456789"})
    async with serve_in_loop(create_app(ai)) as base:
        yield base


async def test_remote_server_managed_chat_tracks_custom_and_artifacts(server: str) -> None:
    """Responses, the chat and snapshots carry the custom state and artifacts; streamed
    state chunks reach the caller as AgentChunks."""
    async with remote_agent(f"{server}/api/counterAgent") as agent:
        chat = agent.chat()
        turn = chat.send_stream("first")
        chunks = [c.to_wire() async for c in turn.stream]
        first = await turn.response
        assert {"customPatch": [{"op": "replace", "path": "", "value": {"counter": 1}}]} in chunks
        assert first.custom == {"counter": 1} and chat.custom == {"counter": 1}
        second = await chat.send("second")
        assert second.custom == {"counter": 2}
        assert [a.name for a in second.artifacts] == ["doc1", "doc2"]
        snapshot = await agent.get_snapshot(snapshot_id=second.snapshot_id)
        assert snapshot is not None and snapshot.state.custom == {"counter": 2}
        detached = await chat.send("third", wait=False)
        waited = await agent.wait(str(detached.snapshot_id), timeout=30)
        assert waited.custom == {"counter": 3}
        assert [a.name for a in waited.artifacts] == ["doc1", "doc2", "doc3"]


async def test_remote_client_managed_chat_carries_custom_in_the_signed_state(server: str) -> None:
    """The signed blob holds custom and artifacts; the next turn continues from them."""
    async with remote_agent(
        f"{server}/api/counterAgentStateless", state_management="client"
    ) as agent:
        chat = agent.chat()
        first = await chat.send("first")
        assert first.state is not None and first.state["custom"] == {"counter": 1}
        second = await chat.send("second")
        assert second.custom == {"counter": 2} and chat.custom == {"counter": 2}
        assert [a.name for a in chat.artifacts] == ["doc1", "doc2"]
