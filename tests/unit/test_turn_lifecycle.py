"""The turn state machine seen through the API: statuses, abort, retries, one turn at a time."""

from __future__ import annotations

import asyncio

import pytest

from engine import FinishReason, ScriptedModel, TurnFailedError, TurnStatus
from engine.chat import Chat
from engine.errors import (
    SessionBusyError,
    SnapshotNotResumableError,
    StaleSnapshotError,
)
from examples.banking import BankingApp, build
from tests.conftest import TEST_STATE_KEYS
from tests.databases import events_of


def slow_app(max_attempts: int = 3) -> BankingApp:
    """A banking app whose scripted model streams 'slow' answers with a 50 ms delay."""
    return build(
        model=ScriptedModel(slow_chunk_delay=0.05),
        state_keys=TEST_STATE_KEYS,
        max_attempts=max_attempts,
    )


async def wait_until_running(chat: Chat) -> str:
    """Wait until the chat has a turn in flight and return its snapshot id."""
    for _ in range(200):
        if chat.pending_snapshot_id is not None:
            return chat.pending_snapshot_id
        await asyncio.sleep(0.005)
    raise AssertionError("the turn never started")


async def test_abort_of_a_running_turn_answers_pending_once_it_settled_aborted() -> None:
    """Abort of a running turn answers its status before (pending, as Genkit's abort does)
    and returns once the runner stopped it: the snapshot then reads aborted."""
    app = slow_app()
    agent = app.banking_agent
    chat = agent.chat()
    turn = chat.send_stream("slow one two three four five six")
    first = await anext(aiter(turn.stream))
    assert first.text == "Echo: "
    running = chat.pending_snapshot_id
    assert running is not None
    before = await agent.get_snapshot(snapshot_id=running)
    assert before is not None and before.status is TurnStatus.PENDING
    assert await agent.abort(running) is TurnStatus.PENDING
    aborted = await agent.get_snapshot(snapshot_id=running)
    assert aborted is not None and aborted.status is TurnStatus.ABORTED
    res = await turn.response
    assert res.status is TurnStatus.ABORTED
    assert res.finish_reason is FinishReason.ABORTED
    snapshot = await agent.get_snapshot(snapshot_id=running)
    assert snapshot is not None and snapshot.status is TurnStatus.ABORTED
    assert [m.role for m in snapshot.state.messages] == ["user"]
    assert agent.store is not None
    events = await events_of(agent.store, running)
    assert [e.to_status for e in events] == [
        TurnStatus.PENDING,
        TurnStatus.ABORTING,
        TurnStatus.ABORTED,
    ]


async def test_chat_abort_stops_its_own_turn() -> None:
    """chat.abort() aborts the chat's turn in flight; with none in flight it returns None."""
    app = slow_app()
    chat = app.banking_agent.chat()
    assert await chat.abort() is None
    task = asyncio.create_task(chat.send("slow a b c d e f g h"))
    await wait_until_running(chat)
    await asyncio.sleep(0.06)
    assert await chat.abort() is TurnStatus.PENDING
    res = await task
    assert res.status is TurnStatus.ABORTED


async def test_aborted_snapshot_is_resumable_by_a_bare_send() -> None:
    """send() with nothing retries an aborted turn from the conversation it kept."""
    app = slow_app()
    chat = app.banking_agent.chat()
    task = asyncio.create_task(chat.send("slow x y z w"))
    running = await wait_until_running(chat)
    await app.banking_agent.abort(running)
    aborted = await task
    assert chat.snapshot_id == aborted.snapshot_id == running
    res = await chat.send()
    assert res.status is TurnStatus.COMPLETED
    assert res.text == "Echo: slow x y z w"
    assert [m.role for m in res.messages] == ["user", "model"]


async def test_pending_snapshot_cannot_be_continued_until_it_settles() -> None:
    """Continuing a pending snapshot by its id is FAILED_PRECONDITION; sending to its session
    by the session's id is the retryable conflict of a busy session."""
    app = slow_app()
    agent = app.banking_agent
    chat = agent.chat()
    task = asyncio.create_task(chat.send("slow a b c d"))
    running = await wait_until_running(chat)
    with pytest.raises(SnapshotNotResumableError) as by_snapshot:
        await agent.chat(snapshot_id=running).send("hello")
    assert by_snapshot.value.status == "FAILED_PRECONDITION"
    assert "still pending" in by_snapshot.value.message
    with pytest.raises(SessionBusyError) as by_session:
        await agent.chat(session_id=chat.session_id).send("hello")
    assert by_session.value.status == "ABORTED"
    assert by_session.value.snapshot_id == running
    await task


async def test_one_turn_at_a_time_per_session() -> None:
    """A second send on a busy session is a conflict, whichever chat object sends it; a chat
    continuing from where it is (snapshot and session) is refused once the session moved."""
    app = slow_app()
    agent = app.banking_agent
    chat = agent.chat()
    await chat.send("hello")
    twin = agent.chat(session_id=chat.session_id, snapshot_id=chat.snapshot_id)
    task = asyncio.create_task(chat.send("slow a b c d"))
    await wait_until_running(chat)
    with pytest.raises(SessionBusyError) as same_chat:
        await chat.send("me too")
    assert same_chat.value.status == "ABORTED"
    with pytest.raises(SessionBusyError) as other_chat:
        await twin.send("me too")
    assert "already has a running turn" in other_chat.value.message
    first = await task
    assert first.text == "Echo: slow a b c d"
    with pytest.raises(StaleSnapshotError) as stale:
        await twin.send("now it is my turn")
    assert stale.value.snapshot_id == first.snapshot_id
    later = await agent.chat(session_id=chat.session_id).send("now it is my turn")
    assert later.text == "Echo: now it is my turn"


async def test_failed_turn_is_resumable_and_bare_send_retries() -> None:
    """A failed turn is a snapshot with the error; send() retries from its conversation."""
    app = build(state_keys=TEST_STATE_KEYS, max_attempts=1)
    chat = app.banking_agent.chat()
    with pytest.raises(TurnFailedError) as failed:
        await chat.send("flaky request")
    assert failed.value.message == "Scripted transient model failure"
    snapshot = await app.banking_agent.get_snapshot(snapshot_id=failed.value.snapshot_id)
    assert snapshot is not None and snapshot.status is TurnStatus.FAILED
    assert snapshot.error == {
        "status": "UNAVAILABLE",
        "message": "Scripted transient model failure",
    }
    assert [m.role for m in snapshot.state.messages] == ["user"]
    assert chat.snapshot_id == failed.value.snapshot_id
    res = await chat.send()
    assert res.text == "Echo: flaky request"
    assert res.messages[0].text == "flaky request"


async def test_permanent_model_error_fails_the_turn_with_internal() -> None:
    """A plain model exception fails the turn with status INTERNAL and its message."""
    app = build(state_keys=TEST_STATE_KEYS)
    with pytest.raises(TurnFailedError) as failed:
        await app.banking_agent.chat().send("this will fail")
    assert (failed.value.status, failed.value.message) == ("INTERNAL", "Scripted model failure")


async def test_transient_errors_are_retried_with_backoff() -> None:
    """A transient model failure is retried automatically; the audit trail shows the retry."""
    app = build(state_keys=TEST_STATE_KEYS, max_attempts=3)
    res = await app.banking_agent.chat().send("flaky but fine")
    assert res.text == "Echo: flaky but fine"
    store, turn_id = app.banking_agent.store, res.snapshot_id
    assert store is not None and turn_id is not None
    events = await events_of(store, turn_id)
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, TurnStatus.PENDING),
        (TurnStatus.PENDING, TurnStatus.PENDING),
        (TurnStatus.PENDING, TurnStatus.COMPLETED),
    ]
    turn = await store.get_turn(turn_id)
    assert turn is not None and turn.attempts == 2


@pytest.mark.behaviour
async def test_get_snapshot_by_session_returns_the_latest(app: BankingApp) -> None:
    """get_snapshot(session_id=...) is the newest snapshot; unknown ids give None."""
    agent = app.banking_agent
    chat = agent.chat()
    await chat.send("one")
    second = await chat.send("two")
    latest = await agent.get_snapshot(session_id=second.session_id)
    assert latest is not None and latest.snapshot_id == second.snapshot_id
    assert latest.status is TurnStatus.COMPLETED
    assert [m.text for m in latest.state.messages] == ["one", "Echo: one", "two", "Echo: two"]
    assert await agent.get_snapshot(snapshot_id="nope") is None
    assert await agent.get_snapshot(session_id="nope") is None
    assert await agent.abort("nope") is None


@pytest.mark.behaviour
async def test_abort_of_a_settled_snapshot_is_a_no_op(app: BankingApp) -> None:
    """Aborting a completed snapshot changes nothing and returns completed."""
    res = await app.banking_agent.chat().send("hi")
    assert res.snapshot_id is not None
    assert await app.banking_agent.abort(res.snapshot_id) is TurnStatus.COMPLETED


@pytest.mark.behaviour
async def test_reopened_session_continues_the_conversation(app: BankingApp) -> None:
    """chat(session_id=...) continues from the session's latest snapshot in a new chat object."""
    first = await app.banking_agent.chat().send("Transfer $500 to my savings account.")
    reopened = app.banking_agent.chat(session_id=first.session_id)
    res = await reopened.resume(respond=[first.interrupts[0].respond({"approved": True})])
    assert res.text == "Done. Transaction txn-500-my-savings-account."
    assert res.session_id == first.session_id
