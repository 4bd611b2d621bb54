"""The store contract for the approval inbox and for retention, on every store.

Same ``store`` fixture as the other ``test_store_*`` modules: in memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.errors import ApprovalNotPendingError
from engine.store import ApprovalQuery, InterruptAnswer, SessionStore, TurnInput
from tests.databases import events_of
from tests.integration.store_support import (
    COMPLETED,
    PENDING,
    claim,
    new_turn,
    paused_turn,
    record_decision,
    settle,
)

LATER = timedelta(hours=1)


async def settled_session(store: SessionStore, session_id: str) -> str:
    """A session with one completed turn; returns the turn id."""
    turn_id = f"{session_id}-t"
    await store.create_turn(new_turn(turn_id, session_id))
    leased = await claim(store, turn_id)
    await settle(store, turn_id, COMPLETED, leased.lease_token)
    return turn_id


# -- inbox ---------------------------------------------------------------------------------


async def test_open_approvals_list_undecided_calls_of_paused_latest_turns(
    store: SessionStore,
) -> None:
    """list_approvals shows each interrupted call of a paused session head, oldest first."""
    await paused_turn(store, "p1", "s1", interrupted=("a", "b"))
    await paused_turn(store, "p2", "s2")
    await settled_session(store, "s3")
    found = await store.list_approvals(ApprovalQuery())
    assert [(a.turn_id, a.ref) for a in found] == [("p1", "a"), ("p1", "b"), ("p2", "r1")]
    assert {a.session_id for a in found} == {"s1", "s2"}
    assert all(a.interrupt == "transferMoney" and a.round == 1 for a in found)


async def test_open_approvals_filter_and_page(store: SessionStore) -> None:
    """Filters by agent, interrupt name, owner and age; keyset pages never repeat an entry."""
    await paused_turn(store, "p1", "s1", interrupted=("a", "b", "c"))
    everything = await store.list_approvals(ApprovalQuery())
    first = await store.list_approvals(ApprovalQuery(limit=2))
    last = first[-1]
    rest = await store.list_approvals(
        ApprovalQuery(after=(last.created_at, last.turn_id, last.ref))
    )
    assert [a.ref for a in first + rest] == [a.ref for a in everything] == ["a", "b", "c"]
    assert await store.list_approvals(ApprovalQuery(agents=("somebody-else",))) == []
    assert await store.list_approvals(ApprovalQuery(interrupt="userApproval")) == []
    assert await store.list_approvals(ApprovalQuery(owner="alice")) == []
    too_old = datetime.now(UTC) - LATER
    assert await store.list_approvals(ApprovalQuery(created_before=too_old)) == []
    assert len(await store.list_approvals(ApprovalQuery(created_before=datetime.now(UTC)))) == 3


async def test_a_decision_is_recorded_once_and_leaves_the_call_interrupted(
    store: SessionStore,
) -> None:
    """record_decision stores answer/decider/moment, drops the entry from the inbox, and a
    second decision on the same call is a conflict."""
    await paused_turn(store, "p1", "s1", interrupted=("a", "b"))
    decided = await record_decision(
        store, "p1", 1, "a", answer={"respond": {"ok": True}}, decided_by="alice"
    )
    assert decided.status.value == "interrupted"
    assert decided.answer == {"respond": {"ok": True}}
    assert decided.decided_by == "alice" and decided.decided_at is not None
    assert [a.ref for a in await store.list_approvals(ApprovalQuery())] == ["b"]
    with pytest.raises(ApprovalNotPendingError):
        await record_decision(store, "p1", 1, "a", answer={"respond": {}}, decided_by="bob")
    rows = {c.ref: c for c in await store.list_calls("p1")}
    assert rows["a"].decided_by == "alice"


async def test_no_decision_on_a_call_that_is_not_open(store: SessionStore) -> None:
    """Unknown calls, finished calls and calls of a superseded turn cannot be decided."""
    await paused_turn(store, "p1", "s1")
    for ref in ("nope", "done"):
        with pytest.raises(ApprovalNotPendingError):
            await record_decision(store, "p1", 1, ref, answer={"respond": 1}, decided_by=None)
    answer = InterruptAnswer(turn_id="p1", round=1, ref="r1", answer={"respond": 1})
    resume = new_turn("p2", "s1", kind="resume", parent_id="p1")
    resume = resume.model_copy(update={"input": TurnInput(kind="resume")})
    await store.create_turn(resume, answers=[answer])
    with pytest.raises(ApprovalNotPendingError):
        await record_decision(store, "p1", 1, "r1", answer={"respond": 2}, decided_by=None)


async def test_the_resume_keeps_the_recorded_decider_and_moment(store: SessionStore) -> None:
    """Answering a decided call keeps who decided it and when (the inbox's record)."""
    await paused_turn(store, "p1", "s1")
    decided = await record_decision(store, "p1", 1, "r1", answer={"respond": 1}, decided_by="alice")
    answer = InterruptAnswer(
        turn_id="p1", round=1, ref="r1", answer={"respond": 1}, decided_by="alice"
    )
    resume = new_turn("p2", "s1", kind="resume", parent_id="p1")
    await store.create_turn(resume, answers=[answer])
    (row,) = [c for c in await store.list_calls("p1") if c.ref == "r1"]
    assert row.status.value == "answered"
    assert row.decided_by == "alice"
    assert row.decided_at == decided.decided_at


# -- retention -----------------------------------------------------------------------------


async def test_prune_deletes_idle_sessions_and_everything_they_hold(store: SessionStore) -> None:
    """Idle settled sessions go with their turns and journal; paused and running ones stay."""
    gone = await settled_session(store, "old")
    await paused_turn(store, "waiting", "paused")  # an open approval: kept however old
    await store.create_turn(new_turn("running", "busy"))  # pending: kept
    deleted = await store.prune_sessions(settled_before=datetime.now(UTC) + LATER)
    assert deleted == 1
    assert await store.get_session("old") is None
    assert await store.get_turn(gone) is None
    assert await store.list_calls(gone) == []
    assert await events_of(store, gone) == []
    assert await store.get_session("paused") is not None
    assert (await store.get_turn("running")) is not None
    assert (await store.get_turn("running")).status is PENDING  # type: ignore[union-attr]


async def test_prune_keeps_sessions_active_since_the_cutoff_and_honours_the_limit(
    store: SessionStore,
) -> None:
    """Nothing newer than the cutoff is deleted; at most ``limit`` sessions per call."""
    for name in ("a", "b", "c"):
        await settled_session(store, name)
    assert await store.prune_sessions(settled_before=datetime.now(UTC) - LATER) == 0
    assert await store.prune_sessions(settled_before=datetime.now(UTC) + LATER, limit=2) == 2
    assert await store.prune_sessions(settled_before=datetime.now(UTC) + LATER, limit=2) == 1
    assert await store.prune_sessions(settled_before=datetime.now(UTC) + LATER) == 0


async def test_prune_judges_a_session_by_its_latest_turn_and_counts_it_once(
    store: SessionStore,
) -> None:
    """A session whose first turn is older than the cutoff but which had a turn since is
    kept; a session of several turns all older goes whole, counting once towards the limit."""
    done = [await settled_session(store, "done")]
    await store.create_turn(new_turn("done-t2", "done", parent_id=done[0]))
    done.append("done-t2")
    await settle(store, "done-t2", COMPLETED, (await claim(store, "done-t2")).lease_token)
    first = await settled_session(store, "ongoing")
    cutoff = datetime.now(UTC)
    await store.create_turn(new_turn("ongoing-t2", "ongoing", parent_id=first))
    await settle(store, "ongoing-t2", COMPLETED, (await claim(store, "ongoing-t2")).lease_token)

    assert await store.prune_sessions(settled_before=cutoff, limit=1) == 1
    assert await store.prune_sessions(settled_before=cutoff, limit=1) == 0
    assert await store.get_session("done") is None
    assert [await store.get_turn(turn_id) for turn_id in done] == [None, None]
    assert await store.get_session("ongoing") is not None
    assert await store.get_turn(first) is not None
