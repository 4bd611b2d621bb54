"""The SessionStore contract on creating turns: a session's first turn, busy sessions,
answered interrupts, and which snapshot a new turn may continue.

Every test runs on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from engine.conversation.parts import Message
from engine.errors import (
    ApprovalNotPendingError,
    InvalidArgumentError,
    SessionBusyError,
    StaleSnapshotError,
)
from engine.store import InterruptAnswer, SessionStore, ToolCallStatus
from tests.databases import events_of
from tests.integration.store_support import (
    ABORTED,
    ABORTING,
    AGENT,
    PENDING,
    answer,
    assert_recent,
    calls_by_ref,
    latest_id,
    new_turn,
    paused_turn,
    settle,
    turn_in,
    wire,
)

# -- create_turn -------------------------------------------------------------------------


async def test_create_turn_inserts_pending_turn_session_round_zero_and_event(
    store: SessionStore,
) -> None:
    """create_turn inserts a pending turn, its session, its committed round 0 and one event."""
    hello = Message.user("hi")
    record = await store.create_turn(
        new_turn("t1", "s1", messages=[hello], owner="alice", max_attempts=3)
    )
    assert (record.id, record.session_id, record.agent, record.parent_id) == (
        "t1",
        "s1",
        AGENT,
        None,
    )
    assert record.status is PENDING
    assert (record.finish_reason, record.error, record.settled_at) == (None, None, None)
    assert (record.attempts, record.max_attempts, record.lease_token) == (0, 3, 0)
    assert (record.lease_owner, record.lease_expires_at) == (None, None)
    assert record.history_length == 0
    assert record.input.kind == "message"
    assert record.input.message is not None and record.input.message.to_wire() == hello.to_wire()
    for moment in (record.created_at, record.updated_at, record.run_after):
        assert_recent(moment)
    assert record.run_after <= datetime.now(UTC)
    assert await store.get_turn("t1") == record

    session = await store.get_session("s1")
    assert session is not None
    assert (session.id, session.agent, session.owner) == ("s1", AGENT, "alice")
    assert_recent(session.created_at)
    assert_recent(session.updated_at)

    rounds = await store.load_rounds("t1")
    assert [(r.round, r.committed, wire(r.messages)) for r in rounds] == [(0, True, wire([hello]))]
    assert wire(await store.load_conversation("t1")) == wire([hello])
    assert await store.list_calls("t1") == []

    events = await events_of(store, "t1")
    assert [(e.turn_id, e.from_status, e.to_status, e.attempt) for e in events] == [
        ("t1", None, PENDING, 0)
    ]
    assert_recent(events[0].at)


@pytest.mark.parametrize("holding", ["pending", "leased", "aborting"])
async def test_create_turn_in_busy_session_raises_and_writes_nothing(
    store: SessionStore, holding: str
) -> None:
    """A second turn in a session holding a pending or aborting turn is refused until it settles."""
    if holding == "pending":
        token = None
        await store.create_turn(new_turn("t1"))
    else:
        token = (await turn_in(store, ABORTING if holding == "aborting" else PENDING)).lease_token
    session_before = await store.get_session("s1")

    with pytest.raises(SessionBusyError):
        await store.create_turn(new_turn("t2", parent_id="t1", history_length=1))

    assert await store.get_turn("t2") is None
    assert await latest_id(store) == "t1"
    assert await store.get_session("s1") == session_before

    await settle(store, "t1", ABORTED, token)
    created = await store.create_turn(new_turn("t2", parent_id="t1", history_length=1))
    assert created.status is PENDING
    assert await latest_id(store) == "t2"


async def test_busy_session_leaves_answered_interrupts_pending(store: SessionStore) -> None:
    """A create_turn refused because the session is busy applies none of its answers."""
    await paused_turn(store, "p1")
    await store.create_turn(new_turn("t2", parent_id="p1", history_length=1))

    with pytest.raises(SessionBusyError):
        await store.create_turn(new_turn("t3", parent_id="p1"), answers=[answer("p1", "r1")])

    row = (await calls_by_ref(store, "p1"))["r1"]
    assert (row.status, row.answer, row.decided_at) == (ToolCallStatus.INTERRUPTED, None, None)
    assert await store.get_turn("t3") is None


async def test_create_turn_rejects_session_of_another_agent(store: SessionStore) -> None:
    """create_turn in a session that belongs to another agent raises InvalidArgumentError."""
    await store.create_turn(new_turn("t1"))
    await settle(store, "t1")
    session_before = await store.get_session("s1")

    with pytest.raises(InvalidArgumentError):
        await store.create_turn(new_turn("t2", agent="intruder", parent_id="t1"))

    assert await store.get_turn("t2") is None
    assert await store.get_session("s1") == session_before
    assert await latest_id(store) == "t1"


@pytest.mark.parametrize("session_id", ["s1", "s2"])
async def test_create_turn_rejects_duplicate_turn_id(store: SessionStore, session_id: str) -> None:
    """A turn id that already exists is refused (InvalidArgumentError), in any session."""
    await store.create_turn(new_turn("t1", messages=[Message.user("original")]))
    original = await settle(store, "t1")

    with pytest.raises(InvalidArgumentError):
        await store.create_turn(new_turn("t1", session_id, messages=[Message.user("copy")]))

    assert await store.get_turn("t1") == original
    assert wire(await store.load_conversation("t1")) == wire([Message.user("original")])
    if session_id == "s2":
        assert await store.get_session("s2") is None


# -- answers -----------------------------------------------------------------------------


async def test_create_turn_marks_answered_interrupts(store: SessionStore) -> None:
    """create_turn(answers=...) marks each interrupted row answered with its decision."""
    await paused_turn(store, "p1", interrupted=("r1", "r2"))
    restart = InterruptAnswer(
        turn_id="p1", round=1, ref="r2", answer={"restart": {"approved": True}}
    )

    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"),
        answers=[answer("p1", "r1", {"approved": False}, decided_by="bob"), restart],
    )

    rows = await calls_by_ref(store, "p1")
    assert rows["r1"].status is ToolCallStatus.ANSWERED
    assert rows["r1"].answer == {"respond": {"approved": False}}
    assert rows["r1"].decided_by == "bob"
    assert_recent(rows["r1"].decided_at)
    assert rows["r2"].status is ToolCallStatus.ANSWERED
    assert rows["r2"].answer == {"restart": {"approved": True}}
    assert rows["r2"].decided_by is None
    assert_recent(rows["r2"].decided_at)
    assert rows["done"].status is ToolCallStatus.DONE
    assert rows["done"].answer is None


@pytest.mark.parametrize("bad_ref", ["answered", "unknown", "done"])
async def test_create_turn_with_stale_answer_writes_nothing(
    store: SessionStore, bad_ref: str
) -> None:
    """One answer to a row that is not interrupted fails the whole create_turn, writing nothing."""
    await paused_turn(store, "p1", interrupted=("r1", "answered"))
    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"), answers=[answer("p1", "answered")]
    )
    await settle(store, "t2")
    session_before = await store.get_session("s1")
    rows_before = await calls_by_ref(store, "p1")

    with pytest.raises(ApprovalNotPendingError):
        await store.create_turn(
            new_turn("t3", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1"), answer("p1", bad_ref, "late")],
        )

    assert await calls_by_ref(store, "p1") == rows_before
    assert rows_before["r1"].status is ToolCallStatus.INTERRUPTED
    assert await store.get_turn("t3") is None
    assert await store.get_session("s1") == session_before
    assert await latest_id(store) == "t2"


async def test_concurrent_resumes_of_one_snapshot_create_one_turn(store: SessionStore) -> None:
    """Ten resumes of one paused snapshot at once: one turn is created with its answers, every
    other attempt gets a typed conflict and writes nothing (no second turn, no answer of its)."""
    await paused_turn(store, "p1", interrupted=("r1", "r2"))

    async def resume(number: int) -> str:
        await store.create_turn(
            new_turn(f"t{number}", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1", number, f"u{number}"), answer("p1", "r2", number)],
        )
        return f"t{number}"

    outcomes = await asyncio.gather(*(resume(n) for n in range(10)), return_exceptions=True)

    winners = [o for o in outcomes if isinstance(o, str)]
    assert len(winners) == 1, outcomes
    assert all(
        isinstance(o, ApprovalNotPendingError | SessionBusyError)
        for o in outcomes
        if o not in winners
    ), outcomes
    number = int(winners[0][1:])
    rows = await calls_by_ref(store, "p1")
    assert {ref: (rows[ref].status, rows[ref].answer) for ref in ("r1", "r2")} == {
        "r1": (ToolCallStatus.ANSWERED, {"respond": number}),
        "r2": (ToolCallStatus.ANSWERED, {"respond": number}),
    }
    assert rows["r1"].decided_by == f"u{number}"
    assert [await store.get_turn(f"t{n}") is not None for n in range(10)].count(True) == 1
    assert await latest_id(store) == winners[0]


async def test_stale_answer_in_new_session_creates_no_session(store: SessionStore) -> None:
    """A create_turn refused for a foreign answer does not create its new session either."""
    with pytest.raises(InvalidArgumentError):
        await store.create_turn(new_turn("t1", "fresh"), answers=[answer("nowhere", "r1")])

    assert await store.get_session("fresh") is None
    assert await store.get_turn("t1") is None
    assert await store.latest_turn("fresh") is None


async def test_interrupt_can_be_answered_only_once(store: SessionStore) -> None:
    """A second turn answering an interrupt already answered gets ApprovalNotPendingError."""
    await paused_turn(store, "p1")
    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"), answers=[answer("p1", "r1", "first", "ann")]
    )
    await settle(store, "t2")

    with pytest.raises(ApprovalNotPendingError):
        await store.create_turn(
            new_turn("t3", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1", "second", "bob")],
        )

    row = (await calls_by_ref(store, "p1"))["r1"]
    assert (row.answer, row.decided_by) == ({"respond": "first"}, "ann")
    assert await store.get_turn("t3") is None


async def test_answers_must_decide_calls_of_the_parent_once(store: SessionStore) -> None:
    """Answers naming another turn's call, or one call twice, are refused and write nothing."""
    await paused_turn(store, "p1", interrupted=("r1", "r2"))
    await paused_turn(store, "q1", "s2")
    with pytest.raises(InvalidArgumentError):
        await store.create_turn(
            new_turn("t2", kind="resume", parent_id="p1"), answers=[answer("q1", "r1")]
        )
    with pytest.raises(InvalidArgumentError):
        await store.create_turn(
            new_turn("t2", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1"), answer("p1", "r1", False)],
        )
    assert await store.get_turn("t2") is None
    statuses = {c.ref: c.status for c in await store.list_calls("p1")}
    assert statuses["r1"] is ToolCallStatus.INTERRUPTED
    assert {c.status for c in await store.list_calls("q1") if c.ref == "r1"} == {
        ToolCallStatus.INTERRUPTED
    }


# -- reads -------------------------------------------------------------------------------


async def test_reads_of_unknown_ids_return_none(store: SessionStore) -> None:
    """get_turn, get_session and latest_turn return None for ids the store never saw."""
    await store.create_turn(new_turn("t1"))

    assert await store.get_turn("nope") is None
    assert await store.get_session("nope") is None
    assert await store.latest_turn("nope") is None


async def test_latest_turn_is_newest_created(store: SessionStore) -> None:
    """latest_turn returns the session's newest turn."""
    await store.create_turn(new_turn("root"))
    assert await latest_id(store) == "root"
    await settle(store, "root")
    await store.create_turn(new_turn("child", parent_id="root", history_length=1))
    await settle(store, "child")

    latest = await store.latest_turn("s1")
    assert latest is not None and latest.id == "child"
    assert latest.parent_id == "root"


async def test_a_turn_continuing_an_older_snapshot_is_refused(store: SessionStore) -> None:
    """A new turn whose parent is no longer the session's latest gets StaleSnapshotError
    naming the latest, and nothing is written (no branch that would drop a message)."""
    await store.create_turn(new_turn("root"))
    await settle(store, "root")
    await store.create_turn(new_turn("child", parent_id="root", history_length=1))
    await settle(store, "child")
    session_before = await store.get_session("s1")

    with pytest.raises(StaleSnapshotError) as refused:
        await store.create_turn(new_turn("branch", parent_id="root", history_length=1))

    assert refused.value.snapshot_id == "child"
    assert refused.value.status == "ABORTED"
    assert await store.get_turn("branch") is None
    assert await latest_id(store) == "child"
    assert await store.get_session("s1") == session_before


async def test_a_first_turn_in_a_session_with_turns_is_refused(store: SessionStore) -> None:
    """A turn with no parent cannot join a session that already has turns: it would start
    the conversation over and hide the earlier messages."""
    await store.create_turn(new_turn("root"))
    await settle(store, "root")

    with pytest.raises(StaleSnapshotError):
        await store.create_turn(new_turn("again"))

    assert await store.get_turn("again") is None
    assert await latest_id(store) == "root"
