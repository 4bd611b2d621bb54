"""A settling turn claims the next one for the slot it frees, in the same round trip.

On PostgreSQL the settle and its follow-on claim run as one pipeline with one sync: one
round trip and one commit (engine.store.FollowOnClaim, stores/fenced.py). The worker pool
asks every settle for it, so a busy pool moves from turn to turn without claim statements
of its own. These tests run on PostgreSQL with real worker pools.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from engine import Engine, FinishReason, ScriptedModel, TurnStatus
from engine.store import FollowOnClaim, Transition
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, listen_ready, sql_store
from tests.integration.test_work_hints import AGENT, eventually, new_turn
from tests.support import ListModel, record_calls, say
from workers import WorkerPool


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


def xmin_of(store: SqlSessionStore, *turn_ids: str) -> set[str]:
    """The transaction ids that last wrote these turns' rows."""
    dsn = libpq_dsn(store.url)
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(
            "SELECT xmin::text FROM turns WHERE id = ANY(%s)", (list(turn_ids),)
        ).fetchall()
    return {row[0] for row in rows}


async def test_the_settle_and_its_claim_commit_together(store: SqlSessionStore) -> None:
    """The settled turn and the turn its claim leased were written by one transaction."""
    await store.create_turn(new_turn("first"))
    await store.create_turn(new_turn("next"))
    (leased,) = await store.claim_next(owner="w", lease_seconds=30, among=["first"])
    follow = FollowOnClaim(owner="w", lease_seconds=30, agents=[AGENT])

    await store.transition(
        "first",
        Transition(
            expected={TurnStatus.PENDING},
            new=TurnStatus.COMPLETED,
            lease_token=leased.turn.lease_token,
            finish_reason=FinishReason.STOP,
            then_claim=follow,
        ),
    )

    assert [t.turn.id for t in follow.claimed] == ["next"]
    assert len(xmin_of(store, "first", "next")) == 1


async def test_a_busy_slot_moves_from_turn_to_turn_without_claims_of_its_own(
    store: SqlSessionStore,
) -> None:
    """Five queued turns through one slot: the pool's loop scans the queue once (the first
    turn); each settle claims the next; the last settle finds the queue empty, and the freed
    slot does not scan it again."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    ai.define_agent(name=AGENT, store=store, execution="workers")
    assert await listen_ready(store)
    store.take_work_hints()  # the connect leaves the hints incomplete: start complete
    for n in range(5):
        await store.create_turn(new_turn(f"t{n}"))
    calls = record_calls(store, "claim_next")
    pool = WorkerPool(ai, store, concurrency=1, poll_interval=30.0, scheduler=False)
    async with pool:

        async def all_done() -> bool:
            turns = [await store.get_turn(f"t{n}") for n in range(5)]
            return all(t is not None and t.status is TurnStatus.COMPLETED for t in turns)

        await eventually(all_done)
        assert pool.claimed_total == 5

    # One scan of the queue, the first. (A claim of announced ids may follow, when an
    # announcement reaches the pool after its turn was served: it finds nothing.)
    claims = [call.kwargs for call in calls]
    assert [c for c in claims if c.get("among") is None] == claims[:1]


async def test_a_stopping_pool_asks_its_settles_for_nothing_more(
    store: SqlSessionStore,
) -> None:
    """A turn that settles after its pool was told to stop claims nothing for its slot:
    the turn queued behind it stays queued for the next worker."""
    model = ListModel([say("done"), say("not for this pool")])
    model.gate = asyncio.Event()  # holds the first turn's model call
    ai = Engine(model=model, state_keys=TEST_STATE_KEYS)
    ai.define_agent(name=AGENT, store=store, execution="workers")
    pool = WorkerPool(ai, store, concurrency=1, poll_interval=30.0, scheduler=False)
    async with pool:
        await store.create_turn(new_turn("running"))

        async def asked() -> bool:
            return bool(model.requests)

        await eventually(asked)
        await store.create_turn(new_turn("queued"))  # the only slot is busy
        pool.request_stop()
        model.gate.set()

    running, queued = await store.get_turn("running"), await store.get_turn("queued")
    assert running is not None and running.status is TurnStatus.COMPLETED
    assert queued is not None and (queued.status, queued.attempts) == (TurnStatus.PENDING, 0)
