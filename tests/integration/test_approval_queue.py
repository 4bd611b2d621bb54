"""approval_queue holds exactly the rows of the old open_approvals view, on both databases.

The triggers of migration 0003 keep the table in step with ``tool_calls`` and ``turns``. Each
test drives writes (through the store, or as an operator would by hand) and after every step
compares the view — and the queue's own columns — with the view's old definition (the
three-way join of migration 0001) evaluated on the same data.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
import pytest
import sqlalchemy as sa

from engine.store import (
    ApprovalQuery,
    InterruptAnswer,
    NewTurn,
    RoundRecord,
    ToolCallStatus,
    TurnInput,
)
from stores import SqlSessionStore
from stores.schema import tool_calls
from tests.databases import libpq_dsn, postgres_url, sql_store
from tests.integration.store_support import (
    COMPLETED,
    asks,
    claim,
    new_turn,
    paused_turn,
    record_decision,
    settle,
    settle_interrupted,
    tool_call,
)

# The old view's rows (0001), and what the queue must hold for each of them.
OPEN_CALLS = """
    FROM tool_calls c
    JOIN turns t ON t.id = c.turn_id
    WHERE c.status = 'interrupted'
      AND t.status = 'completed' AND t.finish_reason = 'interrupted'
      AND NOT EXISTS (
          SELECT 1 FROM turns later
          WHERE later.session_id = t.session_id AND later.seq > t.seq)"""
OLD_VIEW = f"""
    SELECT c.turn_id, t.session_id, t.agent, c.name AS interrupt, c.ref, c.input,
           c.interrupt AS metadata, c.deadline, c.created_at{OPEN_CALLS}
    ORDER BY turn_id, ref"""
NEW_VIEW = """
    SELECT turn_id, session_id, agent, interrupt, ref, input, metadata, deadline, created_at
    FROM open_approvals ORDER BY turn_id, ref"""
OLD_ENTRIES = f"""
    SELECT c.turn_id, c.round, c.ref, t.session_id, t.agent, c.name, c.input, c.interrupt,
           c.deadline, c.decided_at, c.created_at{OPEN_CALLS}
    ORDER BY turn_id, round, ref"""
QUEUE = """
    SELECT turn_id, round, ref, session_id, agent, name, input, interrupt, deadline,
           decided_at, created_at
    FROM approval_queue ORDER BY turn_id, round, ref"""

KINDS = ["sqlite", "postgres"]


def query(store: SqlSessionStore, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on the store's database."""
    with store.db.transaction() as connection:
        return [tuple(row) for row in connection.execute(sa.text(sql))]


def execute(store: SqlSessionStore, sql: str) -> None:
    """One statement in its own transaction, as an operator's psql session would run it."""
    with store.db.transaction() as connection:
        connection.execute(sa.text(sql))


def assert_exact(store: SqlSessionStore) -> list[tuple[str, str]]:
    """The view and the queue agree with the old definition; returns (turn_id, ref) rows."""
    old = query(store, OLD_VIEW)
    assert query(store, NEW_VIEW) == old
    assert query(store, QUEUE) == query(store, OLD_ENTRIES)
    return [(row[0], row[4]) for row in old]


async def settle_paused(
    store: SqlSessionStore, turn_id: str, *refs: str, calls_first: bool
) -> None:
    """Run ``turn_id`` (created already) and settle it paused at ``refs``: the journal rows
    written before the settling transition (save_round), or by it (after its turn UPDATE)."""
    token = (await claim(store, turn_id)).lease_token
    calls = [tool_call(turn_id, 1, ref, ToolCallStatus.INTERRUPTED) for ref in refs]
    round_1 = RoundRecord(round=1, messages=[asks(*refs)], committed=True)
    if calls_first:
        await store.save_round(turn_id, lease_token=token, round=round_1, calls=calls)
        await settle_interrupted(store, turn_id, token)
    else:
        await settle_interrupted(store, turn_id, token, calls, round=round_1)


def resume_of(
    turn_id: str, parent: str, session_id: str, kind: Literal["resume", "expire"] = "resume"
) -> NewTurn:
    """A NewTurn resuming (or expiring) ``parent``."""
    turn = new_turn(turn_id, session_id, kind="resume", parent_id=parent)
    return turn.model_copy(update={"input": TurnInput(kind=kind)})


@pytest.mark.parametrize("kind", KINDS)
async def test_the_queue_follows_a_workload_through_the_store(kind: str) -> None:
    """Send, pause at several calls, decide, resume, pause again (both write orders),
    supersede, abort, expire and prune: after each step the queue is the old view."""
    async with sql_store(kind) as store:
        assert isinstance(store, SqlSessionStore)
        # A turn paused at three calls (plus a done one), and one in another session.
        await paused_turn(store, "p1", "s1", interrupted=("a", "b", "c"))
        await paused_turn(store, "q1", "s2")
        assert assert_exact(store) == [("p1", "a"), ("p1", "b"), ("p1", "c"), ("q1", "r1")]

        # An inbox decision: still open (the view shows decided calls), decided_at copied.
        await record_decision(store, "p1", 1, "a", answer={"respond": 1}, decided_by="alice")
        assert len(assert_exact(store)) == 4
        assert [a.ref for a in await store.list_approvals(ApprovalQuery())] == ["b", "c", "r1"]

        # The resume answers every call of p1: its entries go as the resume is created.
        answers = [
            InterruptAnswer(turn_id="p1", round=1, ref=ref, answer={"respond": 1})
            for ref in ("a", "b", "c")
        ]
        await store.create_turn(resume_of("p2", "p1", "s1"), answers=answers)
        assert assert_exact(store) == [("q1", "r1")]

        # p2 pauses again, its calls written by the settling transition (turn row first).
        await settle_paused(store, "p2", "d", "e", calls_first=False)
        assert assert_exact(store) == [("p2", "d"), ("p2", "e"), ("q1", "r1")]

        # A new message in s2 supersedes the paused q1; then it pauses with its calls written
        # before the settle (calls first).
        await store.create_turn(new_turn("q2", "s2", parent_id="q1"))
        assert assert_exact(store) == [("p2", "d"), ("p2", "e")]
        await settle_paused(store, "q2", "x", calls_first=True)
        assert assert_exact(store) == [("p2", "d"), ("p2", "e"), ("q2", "x")]

        # A send in s2 that is aborted before it ran: q2 stays superseded.
        await store.create_turn(new_turn("q3", "s2", parent_id="q2"))
        assert await store.request_abort("q3") is not None
        assert assert_exact(store) == [("p2", "d"), ("p2", "e")]

        # Expiry of p2 (past its deadline): an expire turn with the calls marked answered.
        deadline = datetime.now(UTC) - timedelta(minutes=1)
        with store.db.transaction() as connection:
            connection.execute(
                sa.update(tool_calls).where(tool_calls.c.turn_id == "p2").values(deadline=deadline)
            )
        assert_exact(store)
        expired = await store.list_expired_interrupts(now=datetime.now(UTC), limit=10)
        assert sorted(c.ref for c in expired) == ["d", "e"]
        await store.create_turn(
            resume_of("p3", "p2", "s1", kind="expire"),
            answers=[
                InterruptAnswer(
                    turn_id="p2", round=1, ref=c.ref, answer={"expired": True}, decided_by="timeout"
                )
                for c in expired
            ],
        )
        assert assert_exact(store) == []
        await settle(store, "p3", COMPLETED)

        # A fresh pause, then retention: old settled sessions go, the paused one stays.
        await paused_turn(store, "w1", "s3", interrupted=("z",))
        pruned = await store.prune_sessions(settled_before=datetime.now(UTC) + timedelta(hours=1))
        assert pruned == 2  # s1 and s2
        assert assert_exact(store) == [("w1", "z")]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_operators_manual_updates_keep_the_queue_exact(kind: str) -> None:
    """UPDATEs and DELETEs by hand on tool_calls and turns move rows in and out of the queue."""
    async with sql_store(kind) as store:
        assert isinstance(store, SqlSessionStore)
        await paused_turn(store, "p1", "s1", interrupted=("a", "b"))
        assert assert_exact(store) == [("p1", "a"), ("p1", "b")]
        steps = [
            # Edit what the approver sees, and a deadline.
            ("UPDATE tool_calls SET input = '{\"amount\": 99}' WHERE ref = 'a'", 2),
            ("UPDATE tool_calls SET deadline = created_at WHERE ref = 'b'", 2),
            ("UPDATE tool_calls SET decided_at = created_at WHERE ref = 'b'", 2),
            # Close one call by hand; reopen the done one.
            ("UPDATE tool_calls SET status = 'done' WHERE ref = 'a'", 1),
            ("UPDATE tool_calls SET status = 'interrupted' WHERE ref = 'done'", 2),
            # The turn stops being paused, then is paused again.
            ("UPDATE turns SET finish_reason = 'stop' WHERE id = 'p1'", 0),
            ("UPDATE turns SET finish_reason = 'interrupted' WHERE id = 'p1'", 2),
            ("UPDATE turns SET status = 'failed' WHERE id = 'p1'", 0),
            ("UPDATE turns SET status = 'completed' WHERE id = 'p1'", 2),
            # A change that is not about pausing (no trigger runs) leaves the entries alone.
            ("UPDATE turns SET attempts = attempts + 1 WHERE id = 'p1'", 2),
            # A journal row deleted by hand takes its entry with it (the foreign key).
            ("DELETE FROM tool_calls WHERE ref = 'b'", 1),
        ]
        for sql, count in steps:
            execute(store, sql)
            assert len(assert_exact(store)) == count, sql


def test_a_decision_and_a_superseding_turn_at_once_leave_no_stale_entry() -> None:
    """PostgreSQL: a decision re-writing an entry and a new turn in the same session commit in
    either order, yet the superseded entry never survives (both lock the paused turn)."""

    async def pause(url: str) -> None:
        store = SqlSessionStore(url)
        try:
            await paused_turn(store, "p1", "s1", interrupted=("a",))
        finally:
            await store.close()

    import asyncio

    with postgres_url() as url:
        asyncio.run(pause(url))
        dsn = libpq_dsn(url)
        with (
            psycopg.connect(dsn) as decider,
            psycopg.connect(dsn) as sender,
            psycopg.connect(dsn, autocommit=True) as watcher,
        ):
            # The decision, not yet committed: it has re-written p1's entry.
            decider.execute("UPDATE tool_calls SET decided_at = now() WHERE ref = 'a'")
            pid = sender.info.backend_pid
            done = threading.Event()

            def send() -> None:
                sender.execute(
                    """INSERT INTO turns (id, session_id, seq, agent, status, input,
                           history_length, run_after, created_at, updated_at)
                       SELECT 'p2', 's1', 2, agent, 'pending', '{"kind": "message"}', 0,
                              now(), now(), now()
                       FROM turns WHERE id = 'p1'"""
                )
                sender.commit()
                done.set()

            thread = threading.Thread(target=send)
            thread.start()
            # The new turn's trigger waits for the decision's lock on p1.
            for _ in range(200):
                waiting = watcher.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                if waiting == ("Lock",):
                    break
                time.sleep(0.02)
            assert not done.is_set()
            decider.commit()
            thread.join(timeout=10)
            assert done.is_set()
            queue = decider.execute("SELECT count(*) FROM approval_queue").fetchone()
            old = decider.execute(f"SELECT count(*) FROM ({OLD_VIEW}) v").fetchone()
            decider.commit()
        assert queue == old == (0,)
