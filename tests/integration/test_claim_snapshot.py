"""A claimed turn's worker continues from the progress as it stands once the claim holds it.

In READ COMMITTED, one statement reads with one snapshot, taken when it starts. A fenced
write of the previous lease holder (a worker that stalled past its lease) can commit after
the claim's snapshot but before the claim locks the row. Had the claim read the progress
itself, that write would be durable yet missing from what the new holder continues from —
it would ask the model again for a round whose tool call has started, and a non-idempotent
call would run blindly. The claim reads the progress it returns with a second statement of
its transaction (one round trip), whose snapshot is taken after the claim's lock; from that
lock on, no fenced write of the old lease can commit.

The tests make the window wide and deterministic: a trigger makes the claim's UPDATE sleep
after it has locked the row, and meanwhile another connection commits a journal row and a
round for the turn (with ``session_replication_role = replica``, so its foreign-key check
does not wait for the claim's lock — the old holder's write landed just before the lock).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from engine.status import FinishReason, TurnStatus
from engine.store import FollowOnClaim, ToolCallStatus, Transition, TurnProgress
from stores import SqlSessionStore
from tests.databases import drop_postgres_database, libpq_dsn, new_postgres_database
from tests.integration.store_support import new_turn

SLOW_OWNER = "slow-claimer"
SLEEP_SECONDS = 0.6

# Sleeps in the UPDATE of a claim by SLOW_OWNER: after its row lock, before it returns.
SLOW_CLAIM = f"""
CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep({SLEEP_SECONDS});
    RETURN NEW;
END $$;
CREATE TRIGGER slow_claim BEFORE UPDATE ON turns FOR EACH ROW
    WHEN (NEW.lease_owner = '{SLOW_OWNER}' AND OLD.lease_owner IS DISTINCT FROM NEW.lease_owner)
    EXECUTE FUNCTION slow_claim();
"""

# What a previous holder's fenced write of round 1 leaves: the model's request (the round
# opened, not committed) and its call journaled as started.
OLD_HOLDERS_WRITE = [
    """
INSERT INTO messages (turn_id, round, position, role, content, metadata, committed, created_at)
VALUES (%(turn)s, 1, 0, 'model',
        '[{"toolRequest": {"name": "transferMoney", "ref": "r1", "input": {"amount": 10}}}]',
        NULL, false, now())""",
    """
INSERT INTO tool_calls (turn_id, round, ref, name, input, status, idempotency_key, started_at,
                        created_at)
VALUES (%(turn)s, 1, 'r1', 'transferMoney', '{"amount": 10}', 'running', %(turn)s || ':r1',
        now(), now())""",
]


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    url = new_postgres_database()
    with psycopg.connect(libpq_dsn(url), autocommit=True) as admin:
        admin.execute(SLOW_CLAIM)
    store = SqlSessionStore(url)
    try:
        yield store
    finally:
        await store.close()
        drop_postgres_database(url)


async def commit_during_claim(store: SqlSessionStore, turn_id: str) -> None:
    """While the slow claim sleeps, commit the old holder's write from another connection."""
    await asyncio.sleep(SLEEP_SECONDS / 3)
    dsn = libpq_dsn(store.db.url)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        await connection.execute("SET session_replication_role = replica")
        async with connection.transaction():
            for statement in OLD_HOLDERS_WRITE:
                await connection.execute(statement, {"turn": turn_id})


def assert_sees_the_started_call(progress: TurnProgress | None) -> None:
    assert progress is not None
    assert [r.round for r in progress.rounds] == [0, 1], "the round the old holder opened"
    assert [c.ref for c in progress.journal] == ["r1"], "the call the old holder started"


async def test_a_claim_sees_a_write_that_committed_while_it_ran(store: SqlSessionStore) -> None:
    """A round and a started call committed after the claim began, before it finished, are
    in the progress the claim returns: the new holder continues the started call."""
    await store.create_turn(new_turn("t1", "s1"))

    claiming = asyncio.create_task(store.claim_turn("t1", owner=SLOW_OWNER, lease_seconds=30.0))
    await commit_during_claim(store, "t1")
    claimed = await claiming

    assert_sees_the_started_call(claimed.progress)
    (call,) = claimed.progress.journal
    assert call.status is ToolCallStatus.RUNNING


async def test_a_follow_on_claim_sees_a_write_that_committed_while_it_ran(
    store: SqlSessionStore,
) -> None:
    """The same for the claim that rides on a settling transition (one transaction)."""
    await store.create_turn(new_turn("t1", "s1"))
    first = await store.claim_turn("t1", owner="w1", lease_seconds=30.0)
    await store.create_turn(new_turn("t2", "s2"))
    follow_on = FollowOnClaim(owner=SLOW_OWNER, lease_seconds=30.0)

    settling = asyncio.create_task(
        store.transition(
            "t1",
            Transition(
                expected={TurnStatus.PENDING},
                new=TurnStatus.COMPLETED,
                lease_token=first.turn.lease_token,
                finish_reason=FinishReason.STOP,
                then_claim=follow_on,
            ),
        )
    )
    await commit_during_claim(store, "t2")
    await settling

    (claimed,) = follow_on.claimed
    assert claimed.turn.id == "t2"
    assert_sees_the_started_call(claimed.progress)
