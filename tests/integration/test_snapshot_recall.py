"""A resume right after the pause continues the snapshot its caller just saw settle.

The agent keeps the snapshots it waited for (engine/agent.py, ``RECENT_SNAPSHOTS``), so the
resume that follows a paused send validates against that copy instead of reading it again:
one statement fewer per approval workflow. The copy can be stale only where another caller
answered the same interrupts meanwhile; the store refuses that atomically, and the request
is then checked once more on a fresh read, so callers see exactly the errors they saw
before. These tests run on PostgreSQL with a real worker pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import engine.agent as agent_module
from engine.errors import ApprovalNotPendingError
from examples.banking import BankingApp, build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.support import record_calls
from workers import WorkerPool


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


async def test_a_resume_after_the_pause_does_not_read_the_paused_snapshot_again(
    store: SqlSessionStore,
) -> None:
    """The resume that follows a paused send validates against the snapshot the send
    returned: the only snapshot it reads is its own result."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(app.ai, store, concurrency=2, scheduler=False):
        chat = app.banking_agent.chat()
        paused = await chat.send("Transfer $5 to acct 5")
        approval = next(i for i in paused.interrupts if i.name == "userApproval")
        calls = record_calls(store, "read_snapshot")
        done = await chat.resume(respond=[approval.respond({"approved": True})])

    assert done.text == "Done. Transaction txn-5-acct-5."
    reads = [call.args[0] for call in calls]
    assert reads and set(reads) == {done.snapshot_id}


async def test_a_recalled_snapshot_answered_elsewhere_is_refused_as_a_fresh_read_is(
    store: SqlSessionStore,
) -> None:
    """Another process approves the paused transfer while this agent still holds its copy:
    this agent's resume gets the same typed error, with the same text, as an agent that
    never saw the snapshot — and the money moves once."""
    here = build(store=store, state_keys=TEST_STATE_KEYS)
    elsewhere_store = SqlSessionStore(store.db.url.render_as_string(hide_password=False))
    elsewhere = build(store=elsewhere_store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(here.ai, store, concurrency=2, scheduler=False):
        paused = await here.banking_agent.chat().send("Transfer $7 to acct 7")
        approval = next(i for i in paused.interrupts if i.name == "userApproval")
        answer = approval.respond({"approved": True})
        first = await elsewhere.banking_agent.chat(snapshot_id=paused.snapshot_id).resume(
            respond=[answer]
        )
        assert first.text == "Done. Transaction txn-7-acct-7."

        with pytest.raises(ApprovalNotPendingError) as recalled:
            await here.banking_agent.chat(snapshot_id=paused.snapshot_id).resume(respond=[answer])
        with pytest.raises(ApprovalNotPendingError) as fresh:
            await elsewhere.banking_agent.chat(snapshot_id=paused.snapshot_id).resume(
                respond=[answer]
            )

    await elsewhere_store.close()
    assert str(recalled.value) == str(fresh.value)
    assert "it was answered already" in str(recalled.value)
    assert [request.amount for _, request in here.transfers] == [7]
    assert elsewhere.transfers == []  # the pool serving `here` ran the one transfer


async def test_an_agent_keeps_a_bounded_number_of_settled_snapshots(
    store: SqlSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the most recent settled snapshots are kept; older ones are read again when a
    caller continues them (and still resume correctly)."""
    monkeypatch.setattr(agent_module, "RECENT_SNAPSHOTS", 2)
    app: BankingApp = build(store=store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(app.ai, store, concurrency=2, scheduler=False):
        paused = [
            await app.banking_agent.chat().send(f"Transfer ${k} to acct {k}") for k in (1, 2, 3)
        ]
        calls = record_calls(store, "read_snapshot")
        for response in reversed(paused):  # newest first: each resume's result is kept too
            approval = next(i for i in response.interrupts if i.name == "userApproval")
            chat = app.banking_agent.chat(snapshot_id=response.snapshot_id)
            await chat.resume(respond=[approval.respond({"approved": True})])

    # The oldest paused snapshot was dropped: its resume read it; the other two did not.
    continued = [r.snapshot_id for r in paused]
    reads = [call.args[0] for call in calls]
    assert [turn for turn in reads if turn in continued] == [continued[0]]
