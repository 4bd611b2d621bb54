"""A turn created in a process whose own worker pool has a free slot starts in that slot,
leased at creation (engine/turns/handover.py): no claim, no work notification, no queue hop.
With every slot taken it goes through the queue as before. An inline agent's caller has its
turns created leased to it the same way.

On PostgreSQL, with the banking example and a pool in the test's process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from engine import TurnStatus
from engine.store import StoredSnapshot, TurnInput, TurnQuery, TurnRecord
from examples.banking import build
from stores import SqlSessionStore, snapshots
from stores.postgres import _ReadBack
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.integration.test_round_trips import approve_a_transfer
from tests.support import record_calls
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


async def test_a_caller_here_gets_the_settled_turn_from_its_settle(
    store: SqlSessionStore,
) -> None:
    """The pool's settle of a turn a caller of this process waits for reads the settled
    snapshot in its own transaction, and the caller takes it: no snapshot read of its own."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(app.ai, store, concurrency=2, scheduler=False, poll_interval=60):
        await approve_a_transfer(app, 1)  # warm
        trips = record_calls(store.db.pg, "fetch_together")
        assert await approve_a_transfer(app, 9) == "Done. Transaction txn-9-acct-9."

    snapshot, _ = snapshots.snapshot_query("any")
    sent = [[statement for statement, _ in call.args[0]] for call in trips]
    assert [trip for trip in sent if trip == [snapshot]] == []
    # Read back by the two settles, after the settle statement.
    assert sum(1 for trip in sent if len(trip) > 1 and trip[-1] is snapshot) == 2


def settled_snapshot(turn_id: str) -> StoredSnapshot:
    """A completed turn's snapshot, as a settle reads it back."""
    now = datetime.now(UTC)
    turn = TurnRecord(
        id=turn_id,
        session_id="s1",
        agent="a",
        parent_id=None,
        status=TurnStatus.COMPLETED,
        input=TurnInput(kind="retry"),
        run_after=now,
        created_at=now,
        updated_at=now,
    )
    return StoredSnapshot(turn=turn, conversation=[], journal=[])


async def test_a_read_during_the_settle_waits_for_what_the_settle_reads() -> None:
    """A waiter woken by the settle's notification before the settle's own answer came
    back reads the snapshot the settle is reading, once."""
    kept = _ReadBack()
    reading = kept.expect("t1")
    taking = asyncio.ensure_future(kept.take("t1"))
    await asyncio.sleep(0.01)
    assert not taking.done()

    snapshot = settled_snapshot("t1")
    reading.done(snapshot)

    assert await taking is snapshot
    assert await kept.take("t1") is None  # once


async def test_a_settled_snapshot_nobody_took_at_once_is_not_served_later() -> None:
    """What a settle read back for a waiter is kept only briefly: a read that comes later
    reads the database (the turn's journal may have changed since); a settle that failed
    leaves its reader to read the database too."""
    kept = _ReadBack()
    kept.KEPT_FOR = 0.0
    kept.expect("t1").done(settled_snapshot("t1"))
    await asyncio.sleep(0.01)
    assert await kept.take("t1") is None

    kept.expect("t2").done(None)
    assert await kept.take("t2") is None

    # Nobody takes t3: the next settle's read-back drops it.
    kept.expect("t3").done(settled_snapshot("t3"))
    await asyncio.sleep(0.01)
    kept.expect("t4")
    assert list(kept._kept) == ["t4"]
