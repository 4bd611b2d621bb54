"""The history builder (``bench/grow_history.py``) copies genuine workflows into a consistent
history: every copied turn has its session, conversation, journal and audit trail under ids of
its own, the copies' open approvals are exactly the queue migration 0003's backfill would
build, and the product's own reads list the copies.

Genuine banking workflows run through the product on a fresh PostgreSQL database, a few left
paused at their approval, then the builder copies them twice (three times the seed in all).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bench.grow_history import grow, queue_mismatches, run_workflows
from engine.store import ApprovalQuery
from stores import SqlSessionStore
from stores.operations import TurnQuery
from tests.databases import libpq_dsn, postgres_url

SEED = 50
OPEN_FRACTION = 0.1
COPIES = 3  # the seed and two copies

#: Child rows whose turn (or session) is missing, per table and column.
ORPHANS = {
    "turns.session_id": "SELECT count(*) FROM turns t "
    "WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session_id)",
    "turns.parent_id": "SELECT count(*) FROM turns t WHERE t.parent_id IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM turns p WHERE p.id = t.parent_id)",
    **{
        f"{table}.turn_id": f"SELECT count(*) FROM {table} c "
        "WHERE NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = c.turn_id)"
        for table in (
            "messages",
            "tool_calls",
            "turn_events",
            "approval_queue",
            "approval_assignments",
        )
    },
}

#: Turns missing what every genuine banking turn has: messages, journal rows, events.
INCOMPLETE = """
SELECT count(*) FROM turns t
WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.turn_id = t.id)
   OR NOT EXISTS (SELECT 1 FROM tool_calls c WHERE c.turn_id = t.id)
   OR NOT EXISTS (SELECT 1 FROM turn_events e WHERE e.turn_id = t.id)"""

#: Journal keys not naming a turn of their row's session (a resumed turn's answer keeps the
#: key of the turn that asked).
STRAY_KEYS = """
SELECT count(*) FROM tool_calls c JOIN turns t ON t.id = c.turn_id
WHERE NOT EXISTS (
    SELECT 1 FROM turns asking
    WHERE asking.session_id = t.session_id AND c.idempotency_key = asking.id || ':' || c.ref)"""

COUNTED = (
    "sessions",
    "turns",
    "messages",
    "tool_calls",
    "turn_events",
    "approval_queue",
    "approval_assignments",
)


def _counts(connection: psycopg.Connection[Any]) -> dict[str, int]:
    counts = {}
    for table in COUNTED:
        row = connection.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert row is not None
        counts[table] = int(row[0])
    return counts


def _scalar(connection: psycopg.Connection[Any], query: str) -> Any:
    row = connection.execute(query).fetchone()
    assert row is not None
    return row[0]


def _assert_consistent(connection: psycopg.Connection[Any]) -> None:
    """No orphan, every turn complete, the queue the backfill's, keys naming their copies."""
    assert {name: _scalar(connection, q) for name, q in ORPHANS.items()} == dict.fromkeys(
        ORPHANS, 0
    )
    assert _scalar(connection, INCOMPLETE) == 0
    assert queue_mismatches(connection) == 0
    assert _scalar(connection, STRAY_KEYS) == 0


@pytest.mark.timeout(120)
async def test_copies_of_genuine_workflows_are_whole_and_listed_by_the_product() -> None:
    """Each table holds three times the seed's rows, none orphaned, every turn complete with
    a UUID id of its own; journal keys name their copy's turns; the queue is the backfill's
    and three times the seed's; ``turns ls`` and ``approvals ls`` list every copy."""
    with postgres_url() as url:
        dsn = libpq_dsn(url)
        left_open = await run_workflows(url, SEED, open_fraction=OPEN_FRACTION, clients=4)
        assert left_open == SEED * OPEN_FRACTION
        with psycopg.connect(dsn, autocommit=True) as connection:
            seed = _counts(connection)
        assert seed["approval_queue"] == left_open
        assert seed["approval_assignments"] == SEED / 2  # every other approval was claimed
        growth = grow(dsn, seed["turns"] * COPIES, span=timedelta(days=3), batch_turns=1)
        assert growth.copies == COPIES - 1
        assert growth.embedding == {"tool_calls": ["idempotency_key"]}

        with psycopg.connect(dsn, autocommit=True) as connection:
            assert _counts(connection) == {table: n * COPIES for table, n in seed.items()}
            _assert_consistent(connection)
            ids = [row[0] for row in connection.execute("SELECT id FROM turns").fetchall()]
            oldest, newest = connection.execute(
                "SELECT min(created_at), max(created_at) FROM turns"
            ).fetchone() or (None, None)
        assert len(set(ids)) == len(ids)
        assert all(str(uuid.UUID(turn_id)) == turn_id for turn_id in ids)
        assert oldest is not None and newest is not None
        assert newest - oldest > timedelta(days=2)

        store = SqlSessionStore(url)
        try:
            listed = await store.list_turns(TurnQuery(limit=1000))
            approvals = await store.list_approvals(ApprovalQuery(limit=1000))
            detail = await store.turn_detail(listed[-1].id)
        finally:
            await store.close()
        assert sorted(row.id for row in listed) == sorted(ids)
        assert len(approvals) == left_open * COPIES
        assert detail is not None and detail.conversation and detail.calls


@pytest.mark.timeout(120)
async def test_a_history_can_keep_its_open_approvals_few_however_many_copies() -> None:
    """With ``open_approvals``, only the copies needed for that many keep the seed's paused
    workflows: the others copy its settled workflows alone, whole and unorphaned, and the
    queue is still exactly the backfill's."""
    with postgres_url() as url:
        dsn = libpq_dsn(url)
        left_open = await run_workflows(url, SEED, open_fraction=OPEN_FRACTION, clients=4)
        with psycopg.connect(dsn, autocommit=True) as connection:
            seed = _counts(connection)
            paused_turns = _scalar(
                connection,
                "SELECT count(*) FROM turns WHERE session_id IN "
                "(SELECT session_id FROM approval_queue)",
            )
        assert paused_turns == left_open  # a paused workflow is its first turn alone
        growth = grow(
            dsn,
            seed["turns"] * COPIES,
            span=timedelta(days=3),
            batch_turns=1,
            open_approvals=2 * left_open,  # the seed and one copy
        )
        assert growth.copies == COPIES - 1
        assert growth.open_approvals == 2 * left_open

        with psycopg.connect(dsn, autocommit=True) as connection:
            counts = _counts(connection)
            assert counts["sessions"] == seed["sessions"] * COPIES - left_open
            assert counts["turns"] == seed["turns"] * COPIES - paused_turns
            assert counts["approval_queue"] == 2 * left_open
            _assert_consistent(connection)
