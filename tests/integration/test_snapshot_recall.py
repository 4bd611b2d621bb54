"""A resume right after the pause continues the snapshot its caller just saw settle.

The resume reads the paused snapshot from the store (the agent keeps no copy of what it
waited for), so an agent that saw the pause and one that never did validate the same
snapshot the same way, and another caller's answer in between is refused alike. These tests
run on PostgreSQL with a real worker pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.errors import ApprovalNotPendingError
from examples.banking import BankingApp, build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from workers import WorkerPool


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


async def test_a_resume_right_after_the_pause_completes_the_transfer(
    store: SqlSessionStore,
) -> None:
    """The resume that follows a paused send, on the same chat, completes the transfer."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(app.ai, store, concurrency=2, scheduler=False):
        chat = app.banking_agent.chat()
        paused = await chat.send("Transfer $5 to acct 5")
        approval = next(i for i in paused.interrupts if i.name == "userApproval")
        done = await chat.resume(respond=[approval.respond({"approved": True})])

    assert done.text == "Done. Transaction txn-5-acct-5."


async def test_a_recalled_snapshot_answered_elsewhere_is_refused_as_a_fresh_read_is(
    store: SqlSessionStore,
) -> None:
    """Another process approves the paused transfer this agent saw pause: this agent's
    resume gets the same typed error, with the same text, as an agent that
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


async def test_paused_snapshots_resumed_newest_first_each_complete(
    store: SqlSessionStore,
) -> None:
    """Three paused transfers, resumed newest first by snapshot id, each move their money."""
    app: BankingApp = build(store=store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(app.ai, store, concurrency=2, scheduler=False):
        paused = [
            await app.banking_agent.chat().send(f"Transfer ${k} to acct {k}") for k in (1, 2, 3)
        ]
        for response in reversed(paused):
            approval = next(i for i in response.interrupts if i.name == "userApproval")
            chat = app.banking_agent.chat(snapshot_id=response.snapshot_id)
            await chat.resume(respond=[approval.respond({"approved": True})])

    assert [request.amount for _, request in app.transfers] == [3, 2, 1]
