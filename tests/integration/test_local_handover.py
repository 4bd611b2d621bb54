"""A turn created in a process whose own worker pool has a free slot starts in that slot,
leased at creation (engine/turns/handover.py): no claim, no work notification, no queue hop.
With every slot taken it goes through the queue as before. An inline agent's caller has its
turns created leased to it the same way.

On PostgreSQL, with the banking example and a pool in the test's process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine import TurnStatus
from engine.store import TurnQuery
from examples.banking import build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.integration.test_round_trips import approve_a_transfer
from workers import WorkerPool


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


async def test_each_turn_starts_in_a_free_local_slot_leased_at_creation(
    store: SqlSessionStore,
) -> None:
    """Send, approve, transfer: both turns are leased to this process's pool by the
    statements creating them (their claim has the creation's own moment), at attempt 1."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    # No poll: the pool's claim loop, which holds the free slots while it claims, stays
    # asleep once the warm-up's turns are claimed.
    pool = WorkerPool(app.ai, store, concurrency=2, scheduler=False, poll_interval=60)
    async with pool:
        await approve_a_transfer(app, 1)  # warm: the loop's first scan is behind us
        assert await approve_a_transfer(app, 7) == "Done. Transaction txn-7-acct-7."

    turns = await store.list_turns(TurnQuery(limit=2))
    assert len(turns) == 2
    for row in turns:
        turn = await store.get_turn(row.id)
        assert turn is not None and turn.attempts == 1
        created, claimed = (await store.timeline(turn.id))[:2]
        assert (created.kind, claimed.kind, claimed.actor) == ("status", "claimed", pool.owner)
        assert claimed.at == created.at == turn.created_at


async def test_with_every_slot_taken_a_new_turn_goes_through_the_queue(
    store: SqlSessionStore,
) -> None:
    """While the pool's one slot is held, a sent turn is created unleased for the queue; the
    pool claims it from there once the slot frees."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    agent = app.banking_agent
    async with WorkerPool(app.ai, store, concurrency=1, scheduler=False) as pool:
        held = await pool.reserve(store=store, agent=agent.name, app_version=None)
        assert held is not None
        assert await pool.reserve(store=store, agent=agent.name, app_version=None) is None

        queued = await agent.chat().send("Transfer $3 to acct 3", wait=False)
        turn_id = str(queued.snapshot_id)
        created = await store.get_turn(turn_id)
        assert created is not None
        assert (created.attempts, created.lease_owner) == (0, None)

        held.release()
        paused = await asyncio.wait_for(agent.wait(turn_id), 15)

    assert paused.finish_reason == "interrupted"
    settled = await store.get_turn(turn_id)
    assert settled is not None
    assert (settled.status, settled.attempts) == (TurnStatus.COMPLETED, 1)


async def test_a_pool_offers_its_slots_only_while_it_runs(store: SqlSessionStore) -> None:
    """The engine knows the pool from its start to its stop; a stopping pool reserves
    nothing."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    pool = WorkerPool(app.ai, store, concurrency=2, scheduler=False)
    assert app.ai.local_pools == []
    async with pool:
        await asyncio.sleep(0)  # the pool's task starts
        assert app.ai.local_pools == [pool]
        pool.request_stop()
        reserved = await pool.reserve(store=store, agent="bankingAgent", app_version=None)
        assert reserved is None
    assert app.ai.local_pools == []


async def test_another_stores_or_agents_turn_is_not_offered_a_slot(
    store: SqlSessionStore,
) -> None:
    """A pool reserves slots only for turns it would claim: of its agents, in its store, at
    a version it serves."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    async with (
        sql_store("postgres") as other,
        WorkerPool(app.ai, store, concurrency=2, scheduler=False) as pool,
    ):
        name = app.banking_agent.name
        assert await pool.reserve(store=other, agent=name, app_version=None) is None
        assert await pool.reserve(store=store, agent="nobody", app_version=None) is None
        assert await pool.reserve(store=store, agent=name, app_version="not-served") is None
        served = await pool.reserve(store=store, agent=name, app_version=pool.versions[0])
        assert served is not None
        served.release()


async def test_an_inline_agents_turns_are_leased_to_their_caller_at_creation(
    store: SqlSessionStore,
) -> None:
    """An inline agent's caller runs its turns itself: each is created leased to it (its
    claim has the creation's own moment), with no claim of its own."""
    app = build(store=store, execution="inline", state_keys=TEST_STATE_KEYS)
    assert await approve_a_transfer(app, 8) == "Done. Transaction txn-8-acct-8."

    turns = await store.list_turns(TurnQuery(limit=2))
    assert len(turns) == 2
    for row in turns:
        created, claimed = (await store.timeline(row.id))[:2]
        assert (claimed.kind, claimed.actor) == ("claimed", app.ai.owner)
        assert claimed.at == created.at
