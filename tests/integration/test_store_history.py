"""A turn's history is append-only and complete: every attempt with its worker, a lost lease
and its reclaim, every tool call's start and end per attempt, pauses, decisions (with a
reject's reason), votes, assignments, escalations and reminders, each with its actor, attempt
and time, on every store (issue 32)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from engine.approvals.rules import vote_rule
from engine.status import FinishReason
from engine.store import (
    AssignmentChange,
    RoundRecord,
    SessionStore,
    TimelineEntry,
    ToolCallStatus,
    Transition,
)
from stores.sql import SqlSessionStore
from tests.databases import sql_store
from tests.integration.store_support import (
    ABORTED,
    ABORTING,
    COMPLETED,
    PENDING,
    SHORT_LEASE,
    answer,
    asks,
    claim,
    new_turn,
    paused_turn,
    record_decision,
    settle_interrupted,
    tool_call,
)

LATER = timedelta(hours=1)
INTERRUPTED = ToolCallStatus.INTERRUPTED


def story(entries: list[TimelineEntry]) -> list[tuple[str, int | None, str | None, str]]:
    """The timeline as (kind, attempt, actor, detail), in order."""
    return [(e.kind, e.attempt, e.actor, e.detail) for e in entries]


async def test_a_reclaimed_turn_keeps_both_attempts_and_the_lost_lease(
    store: SessionStore,
) -> None:
    """A worker dies mid-call; another reclaims after the lease expires and finishes the call:
    the history keeps the first attempt's worker and unfinished start, the lease loss, the
    reclaim, and the second attempt's start and end, each at its own time."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    started = datetime.now(UTC)
    running = tool_call("t1", 1, "transfer-1", ToolCallStatus.RUNNING, started_at=started)
    await store.record_call("t1", lease_token=first.lease_token, call=running)
    await asyncio.sleep(SHORT_LEASE * 3)
    second = await claim(store, "t1", owner="w2")
    restarted = datetime.now(UTC)
    rerun = running.model_copy(update={"started_at": restarted})
    await store.record_call("t1", lease_token=second.lease_token, call=rerun)
    finished = datetime.now(UTC)
    done = rerun.model_copy(update={"status": ToolCallStatus.DONE, "finished_at": finished})
    await store.save_round(
        "t1",
        lease_token=second.lease_token,
        round=RoundRecord(round=1, messages=[asks("transfer-1")], committed=True),
        calls=[done],
    )
    await store.transition(
        "t1", Transition(expected={PENDING}, new=COMPLETED, lease_token=second.lease_token)
    )

    entries = await store.timeline("t1")

    assert story(entries) == [
        ("status", 0, None, "new -> pending"),
        ("claimed", 1, "w1", "claimed by w1 (attempt 1)"),
        ("tool started", 1, "w1", "transferMoney transfer-1"),
        ("lease lost", 1, "w1", "lease of w1 expired (attempt 1)"),
        ("claimed", 2, "w2", "claimed by w2 (attempt 2)"),
        ("tool started", 2, "w2", "transferMoney transfer-1"),
        ("tool done", 2, "w2", "transferMoney transfer-1"),
        ("status", 2, "w2", "pending -> completed"),
    ]
    at = {(e.kind, e.attempt): e.at for e in entries}
    assert abs(at["tool started", 1] - started) < timedelta(milliseconds=1)
    assert abs(at["lease lost", 1] - first.lease_expires_at) < timedelta(milliseconds=1)  # type: ignore[operator]
    assert abs(at["tool started", 2] - restarted) < timedelta(milliseconds=1)
    assert abs(at["tool done", 2] - finished) < timedelta(milliseconds=1)
    assert [e.at for e in entries] == sorted(e.at for e in entries)


CALL_KINDS = {"tool started", "tool done", "tool failed", "paused"}


async def call_story(
    store: SessionStore, turn_id: str
) -> list[tuple[str, int | None, str | None, str]]:
    """The entries of the turn's tool calls, as (kind, attempt, actor, detail), in order."""
    return [entry for entry in story(await store.timeline(turn_id)) if entry[0] in CALL_KINDS]


async def test_every_journal_writer_records_each_start_and_end_once_by_the_lease_owner(
    store: SessionStore,
) -> None:
    """A call recorded, a round saved with two calls, a settle pausing on a third and the
    resume answering it: each start and each end is one entry, by the worker holding the
    current attempt (also after the settle released its lease), and a write that repeats a
    row unchanged, or a resume's answer, adds none."""
    await store.create_turn(new_turn("t1"))
    await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)
    token = (await claim(store, "t1", owner="w2")).lease_token
    # Times in the past, so the pause (recorded at the settle's own time) comes last.
    now = datetime.now(UTC) - timedelta(seconds=10)
    running = tool_call("t1", 1, "a", ToolCallStatus.RUNNING, started_at=now)
    done = running.model_copy(
        update={"status": ToolCallStatus.DONE, "finished_at": now + timedelta(seconds=1)}
    )
    other = tool_call(
        "t1",
        1,
        "b",
        ToolCallStatus.FAILED,
        started_at=now + timedelta(seconds=2),
        finished_at=now + timedelta(seconds=3),
    )
    round = RoundRecord(round=1, messages=[asks("a", "b", "r1")], committed=True)
    paused = tool_call("t1", 1, "r1", ToolCallStatus.INTERRUPTED)

    await store.record_call("t1", lease_token=token, call=running)
    await store.record_call("t1", lease_token=token, call=running)
    await store.save_round("t1", lease_token=token, round=round, calls=[done, other])
    await store.save_round("t1", lease_token=token, round=round, calls=[done, other])
    await settle_interrupted(store, "t1", token, [done, other, paused])
    before_resume = await call_story(store, "t1")
    resumed = new_turn("t2", kind="resume", parent_id="t1", expected_latest_id="t1")
    await store.create_turn(resumed, answers=[answer("t1", "r1", decided_by="carol")])

    assert before_resume == [
        ("tool started", 2, "w2", "transferMoney a"),
        ("tool done", 2, "w2", "transferMoney a"),
        ("tool started", 2, "w2", "transferMoney b"),
        ("tool failed", 2, "w2", "transferMoney b"),
        ("paused", 2, "w2", "transferMoney r1"),
    ]
    assert await call_story(store, "t1") == before_resume


async def test_a_call_paused_by_the_write_that_starts_it_records_its_pause_alone(
    store: SessionStore,
) -> None:
    """An interrupt raised as its call begins, saved with a round or with the settle, is one
    `paused` entry; a call recorded running first and paused later keeps both entries."""
    await store.create_turn(new_turn("t1"))
    token = (await claim(store, "t1", owner="w1")).lease_token
    now = datetime.now(UTC) - timedelta(seconds=10)

    def at(seconds: int) -> datetime:
        return now + timedelta(seconds=seconds)

    at_once = tool_call("t1", 1, "a", INTERRUPTED, started_at=at(0), finished_at=at(0))
    running = tool_call("t1", 1, "b", ToolCallStatus.RUNNING, started_at=at(1))
    later = running.model_copy(update={"status": INTERRUPTED, "finished_at": at(2)})
    at_settle = tool_call("t1", 1, "c", INTERRUPTED, started_at=at(3), finished_at=at(3))
    round = RoundRecord(round=1, messages=[asks("a", "b", "c")], committed=True)

    await store.save_round("t1", lease_token=token, round=round, calls=[at_once])
    await store.record_call("t1", lease_token=token, call=running)
    await settle_interrupted(store, "t1", token, [at_once, later, at_settle])

    assert await call_story(store, "t1") == [
        ("paused", 1, "w1", "transferMoney a"),
        ("tool started", 1, "w1", "transferMoney b"),
        ("paused", 1, "w1", "transferMoney b"),
        ("paused", 1, "w1", "transferMoney c"),
    ]


async def test_a_pause_and_a_reject_are_recorded_at_their_own_times(store: SessionStore) -> None:
    """The pause is recorded when the call paused; the reject, later, with its approver and its
    reason; the call's later answer rewrites neither."""
    await paused_turn(store, "t1")
    paused_at = {e.kind: e.at for e in await store.timeline("t1")}["paused"]
    before = await store.timeline("t1")
    rejection = {"reject": {"reason": "too risky", "by": "bob", "at": "2026-12-06T00:00:00Z"}}
    await record_decision(store, "t1", 1, "r1", answer=rejection, decided_by="bob")
    resumed = new_turn("t2", kind="resume", parent_id="t1", expected_latest_id="t1")
    await store.create_turn(
        resumed,
        answers=[answer("t1", "r1", decided_by="bob").model_copy(update={"answer": rejection})],
    )

    entries = await store.timeline("t1")

    assert entries[: len(before)] == before
    assert [(e.kind, e.actor, e.detail) for e in entries[len(before) :]] == [
        ("decided", "bob", "transferMoney r1 rejected by bob: too risky")
    ]
    assert entries[-1].at > paused_at
    assert entries[-1].attempt == 1


async def test_an_answer_without_an_earlier_decision_is_recorded_as_the_decision(
    store: SessionStore,
) -> None:
    """A resume answering a call nobody decided in the inbox records the decision on the
    paused turn, by the resume's decider."""
    await paused_turn(store, "t1")
    resumed = new_turn("t2", kind="resume", parent_id="t1", expected_latest_id="t1")
    await store.create_turn(resumed, answers=[answer("t1", "r1", decided_by="carol")])

    decided = [e for e in await store.timeline("t1") if e.kind == "decided"]

    assert story(decided) == [("decided", 1, "carol", "transferMoney r1 approved by carol")]


async def test_votes_assignments_escalations_and_reminders_are_recorded(
    store: SessionStore,
) -> None:
    """Each change of who holds an approval, and each vote, appends an entry by its actor."""
    await paused_turn(store, "t1")
    where = ("t1", 1, "r1")

    async def change(action: str, **fields: object) -> None:
        made = AssignmentChange.model_validate({"action": action, **fields})
        assert await store.change_assignment(*where, made, default_group="payments") is not None

    await change("claim", by="alice")
    await change("release", by="alice")
    await change("assign", by="lead", assignee="dave")
    await change("escalate", by="escalation", group="managers")
    await change("remind", every_seconds=60.0)
    outcome = await store.change_approval(
        *where,
        vote_rule(
            voter="dave",
            answer={"respond": True},
            approves=True,
            required=2,
            edit_seen=None,
        ),
    )
    assert outcome.decided is None

    entries = [e for e in await store.timeline("t1") if e.kind not in ("status", "claimed")]

    assert [(e.kind, e.actor, e.detail) for e in entries if not e.kind.startswith("tool")] == [
        ("paused", "w1", "transferMoney r1"),
        ("assignment", "alice", "r1 claimed by alice"),
        ("assignment", "alice", "r1 released by alice (group payments)"),
        ("assignment", "lead", "r1 assigned to dave (group payments) by lead"),
        ("escalation", "escalation", "r1 escalated to group managers"),
        ("reminder", None, "r1 reminder 1 (group managers)"),
        ("vote", "dave", "transferMoney r1: dave approves"),
    ]
    assert all(e.attempt == 1 for e in entries)


async def test_retention_deletes_a_turn_history_with_the_turn(store: SessionStore) -> None:
    """Pruning a settled session leaves nothing of its turns' history."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1")
    await store.transition(
        "t1", Transition(expected={PENDING}, new=COMPLETED, lease_token=leased.lease_token)
    )
    assert len(await store.timeline("t1")) == 3

    assert await store.prune_sessions(settled_before=datetime.now(UTC) + LATER) == 1

    assert await store.timeline("t1") == []


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_database_refuses_to_rewrite_history(kind: str) -> None:
    """An UPDATE of turn_events fails, whoever runs it: entries are only ever appended."""
    async with sql_store(kind) as store:
        await store.create_turn(new_turn("t1"))
        await claim(store, "t1")
        assert isinstance(store, SqlSessionStore)

        def rewrite(connection: sa.Connection) -> None:
            connection.execute(sa.text("UPDATE turn_events SET note = 'forged'"))

        with pytest.raises(Exception, match="append-only"):
            await store.db.write(rewrite)
        assert "forged" not in {e.detail for e in await store.timeline("t1")}


async def test_an_abort_is_recorded_as_requested_then_as_stopped_by_its_worker(
    store: SessionStore,
) -> None:
    """An abort request is nobody's lease act; the worker that stops the turn is the actor of
    the final transition."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1", owner="w1")
    assert (await store.request_abort("t1")).status is ABORTING
    await store.transition(
        "t1",
        Transition(
            expected={ABORTING},
            new=ABORTED,
            lease_token=leased.lease_token,
            finish_reason=FinishReason.ABORTED,
        ),
    )

    entries = [e for e in await store.timeline("t1") if e.kind == "status"]

    assert [(e.attempt, e.actor, e.detail) for e in entries[1:]] == [
        (1, None, "pending -> aborting (abort requested)"),
        (1, "w1", "aborting -> aborted"),
    ]
