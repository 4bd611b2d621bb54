"""Work notifications name the turns they announce, and a woken pool claims those by id.

On PostgreSQL every turn that becomes claimable is announced on the work channel with its
id. The listener keeps those ids for ``take_work_hints``, and a pool woken by one claims
``among`` them through the primary key instead of scanning the claim index (which, on a busy
table, holds many dead entries until the next vacuum). Whatever the hints cannot vouch for —
a reconnect, a full pool, the poll — is found by the ordinary scan.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from engine import Engine, ScriptedModel, TurnStatus
from engine.conversation.parts import Message
from engine.store import NewTurn, Transition, TurnInput
from stores import SqlSessionStore, notify
from stores.notify import LISTEN_STATEMENT
from stores.postgres import PostgresSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, listen_ready, sql_store
from workers import WorkerPool

AGENT = "queued"


def new_turn(turn_id: str) -> NewTurn:
    """A pending turn of ``AGENT`` in a session of its own."""
    return NewTurn(
        id=turn_id,
        session_id=f"s-{turn_id}",
        agent=AGENT,
        input=TurnInput(kind="message", message=Message.user(turn_id)),
        initial_messages=[Message.user(turn_id)],
    )


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 3.0) -> Any:
    """Poll ``check`` until it returns something truthy (at most ``within`` seconds)."""
    async with asyncio.timeout(within):
        while True:
            if result := await check():
                return result
            await asyncio.sleep(0.01)


async def hints_after_notifications(store: SqlSessionStore) -> list[str] | None:
    """Wait for the next work notification, then take the hints."""
    await store.wait_for_work(2.0)
    return store.take_work_hints()


async def test_the_hints_name_every_created_turn_once(store: SqlSessionStore) -> None:
    """Turns created by another process are named, in order, by the next take and not by the
    one after."""
    assert await listen_ready(store)
    store.take_work_hints()  # the connect itself leaves the hints incomplete
    other = SqlSessionStore(store.url)
    try:
        await other.create_turn(new_turn("t1"))
        await other.create_turn(new_turn("t2"))
    finally:
        await other.close()

    taken: list[str] = []

    async def both() -> bool:
        # The two notifications come from two commits: a take may fall between them.
        taken.extend(await hints_after_notifications(store) or [])
        return len(taken) >= 2

    await eventually(both)
    assert taken == ["t1", "t2"]
    assert store.take_work_hints() == []


async def test_a_turn_created_claimed_is_announced_to_no_worker(store: SqlSessionStore) -> None:
    """A turn its creator leased is nobody else's work: of a claimed creation and a plain
    one, committed in that order, only the plain one is named."""
    assert await listen_ready(store)
    store.take_work_hints()
    other = SqlSessionStore(store.url)
    try:
        await other.create_claimed_turn(new_turn("t1"), owner="creator", lease_seconds=30)
        await other.create_turn(new_turn("t2"))
    finally:
        await other.close()

    taken: list[str] = []

    async def announced() -> bool:
        taken.extend(await hints_after_notifications(store) or [])
        return "t2" in taken

    await eventually(announced)
    assert taken == ["t2"]


async def test_more_announcements_than_kept_make_the_hints_incomplete(
    store: SqlSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_WORK_HINTS ids the next take answers None (scan the queue), not a list that
    silently misses turns; the take after it is complete again."""
    monkeypatch.setattr(notify, "MAX_WORK_HINTS", 2)
    assert await listen_ready(store)
    store.take_work_hints()
    other = SqlSessionStore(store.url)
    try:
        for n in range(3):
            await other.create_turn(new_turn(f"t{n}"))
    finally:
        await other.close()

    assert isinstance(store, PostgresSessionStore)
    listener = store._listener

    async def overflowed() -> bool:
        await store.wait_for_work(0.2)
        return len(listener._hints) == 2 and not listener._hints_complete

    await eventually(overflowed)
    assert store.take_work_hints() is None
    assert store.take_work_hints() == []


async def test_the_hints_are_incomplete_after_the_listener_reconnects(
    store: SqlSessionStore,
) -> None:
    """A notification may be lost while the listener is down, so the first take after a
    reconnect answers None (scan the queue); later takes are complete again."""
    assert await listen_ready(store)
    store.take_work_hints()
    assert store.take_work_hints() == []
    dsn = libpq_dsn(store.url)
    listening = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s"
    with psycopg.connect(dsn, autocommit=True) as admin:
        (old_pid,) = admin.execute(listening, (LISTEN_STATEMENT,)).fetchone() or (None,)
        admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))

        async def reconnected() -> bool:
            row = admin.execute(listening, (LISTEN_STATEMENT,)).fetchone()
            return row is not None and row[0] != old_pid

        await eventually(reconnected, within=5.0)
    assert await listen_ready(store)
    assert store.take_work_hints() is None
    assert store.take_work_hints() == []


async def test_a_woken_pool_claims_the_announced_turn_and_leaves_the_queue_to_the_poll(
    store: SqlSessionStore,
) -> None:
    """A retry whose time has come is older in the queue than a newly announced turn, yet the
    woken pool claims only the announced one (by id); the retry waits for the poll."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    ai.define_agent(name=AGENT, store=store, execution="workers")
    await store.create_turn(new_turn("retry"))
    leased = await store.claim_turn("retry", owner="ghost", lease_seconds=30)
    # Handed back to run 0.3 s from now: its announcement comes before it is claimable.
    await store.transition(
        "retry",
        Transition(
            expected={TurnStatus.PENDING},
            new=TurnStatus.PENDING,
            lease_token=leased.turn.lease_token,
            run_after=datetime.now(UTC) + timedelta(seconds=0.3),
        ),
    )
    pool = WorkerPool(ai, store, concurrency=2, poll_interval=30.0, scheduler=False)
    async with pool:
        await asyncio.sleep(0.5)  # the retry is due now, and nobody was told
        await store.create_turn(new_turn("fresh"))

        async def fresh_done() -> bool:
            turn = await store.get_turn("fresh")
            return turn is not None and turn.status is TurnStatus.COMPLETED

        await eventually(fresh_done)
        assert pool.claimed_total == 1
        retry = await store.get_turn("retry")
        assert retry is not None and (retry.lease_owner, retry.attempts) == (None, 1)  # untouched
        # A scan (here, a direct claim_next) still finds it.
        claimed = await store.claim_next(owner="scan", lease_seconds=30, agents=[AGENT])
        assert [t.turn.id for t in claimed] == ["retry"]
