"""A chat continues from the snapshot its last answer was made of, without reading it again.

``chat.send`` answers with the settled turn read whole (its conversation and journal); the
chat's ``resume`` then validates against that copy instead of reading the snapshot a second
time. Whatever could have changed on it since (another resume, a decision recorded) is
checked again by the statement creating the turn, so a stale copy is refused exactly as a
fresh read would be.

On SQLite and PostgreSQL, with the banking example and a worker pool in the test's process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.conversation.parts import Part
from engine.errors import AgentError
from engine.response import AgentResponse
from examples.banking import BankingApp, build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.support import record_calls
from workers import WorkerPool


@pytest.fixture(params=["sqlite", "postgres"])
async def app(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
    async with sql_store(request.param) as store:
        banking = build(store=store, state_keys=TEST_STATE_KEYS)
        async with WorkerPool(banking.ai, store, concurrency=2, poll_interval=0.05):
            yield banking


def approve(paused: AgentResponse) -> dict[str, list[Part]]:
    """The resume approving ``paused``'s transfer."""
    approval = next(i for i in paused.interrupts if i.name == "userApproval")
    return {"respond": [approval.respond({"approved": True})]}


async def test_a_resume_does_not_read_the_snapshot_the_send_answered_with(
    app: BankingApp,
) -> None:
    """The paused snapshot is read once, to answer the send; the resume reads only its own
    settled turn."""
    store = app.banking_agent.store
    assert isinstance(store, SqlSessionStore)
    chat = app.banking_agent.chat()
    paused = await chat.send("Transfer $5 to acct 5")
    reads = record_calls(store, "read_snapshot")

    done = await chat.resume(respond=approve(paused)["respond"])

    assert done.text == "Done. Transaction txn-5-acct-5."
    assert [call.args[0] for call in reads] == [done.snapshot_id]


async def test_a_stale_copy_is_refused_as_a_fresh_read_is(app: BankingApp) -> None:
    """Another chat resumes the paused snapshot first: the first chat's resume, validated
    against its copy, is refused with the same typed error as a chat that reads it now."""
    agent = app.banking_agent
    chat = agent.chat()
    paused = await chat.send("Transfer $6 to acct 6")
    assert paused.snapshot_id is not None
    await agent.chat(snapshot_id=paused.snapshot_id).send(resume=approve(paused))

    with pytest.raises(AgentError) as with_copy:
        await chat.send(resume=approve(paused))
    with pytest.raises(AgentError) as read_now:
        await agent.chat(session_id=paused.session_id, snapshot_id=paused.snapshot_id).send(
            resume=approve(paused)
        )

    assert type(with_copy.value) is type(read_now.value)
    assert with_copy.value.status == read_now.value.status
