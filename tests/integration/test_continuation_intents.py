"""What a send continues, on every store (the ``store`` fixture of ``conftest.py``): the
session, where the chat is, or exactly a snapshot (docs/decisions.md, "What a send
continues")."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from engine import TurnStatus
from engine.errors import (
    ApprovalNotPendingError,
    SnapshotNotResumableError,
    StaleSnapshotError,
    TurnFailedError,
)
from engine.state.snapshots import SessionSnapshot
from engine.store import ApprovalQuery, SessionStore
from examples.banking import BankingApp, build


@pytest.fixture
def app(store: SessionStore) -> BankingApp:
    """The banking example on ``store``, its turns run by the caller."""
    return build(store=store, execution="inline", max_attempts=1)


def texts(snapshot: SessionSnapshot | None) -> list[str]:
    assert snapshot is not None
    return [m.text for m in snapshot.state.messages]


async def test_a_new_message_on_an_older_snapshot_branches_and_leaves_the_source_alone(
    app: BankingApp, store: SessionStore
) -> None:
    """Continuing exactly a snapshot the session has moved past opens a new session holding a
    copy of its conversation; the source session's latest turn and open approval stay."""
    agent = app.banking_agent
    root = await agent.chat().send("hello root")
    paused = await agent.chat(snapshot_id=root.snapshot_id).send("transfer $40 to carol")
    assert paused.interrupts and paused.session_id == root.session_id

    branch = await agent.chat(snapshot_id=root.snapshot_id).send("hello branch")

    assert branch.session_id != root.session_id
    snapshot = await agent.get_snapshot(snapshot_id=branch.snapshot_id)
    assert snapshot is not None and snapshot.parent_id == root.snapshot_id
    assert texts(snapshot) == [
        "hello root",
        "Echo: hello root",
        "hello branch",
        "Echo: hello branch",
    ]
    latest = await agent.get_snapshot(session_id=root.session_id)
    assert latest is not None and latest.snapshot_id == paused.snapshot_id
    approvals = await store.list_approvals(ApprovalQuery())
    assert [a.turn_id for a in approvals] == [paused.snapshot_id]


async def test_continuing_the_snapshot_before_a_failed_turn_appends_to_the_session(
    app: BankingApp,
) -> None:
    """A new message to the snapshot a failed turn continued goes on in the same session,
    leaving the failed turn behind; the failed message is not in the conversation."""
    agent = app.banking_agent
    first = await agent.chat().send("hello first")
    with pytest.raises(TurnFailedError) as failed:
        await agent.chat(snapshot_id=first.snapshot_id).send("please fail now")

    again = await agent.chat(snapshot_id=first.snapshot_id).send("hello again")

    assert again.session_id == first.session_id
    snapshot = await agent.get_snapshot(snapshot_id=again.snapshot_id)
    assert snapshot is not None and snapshot.parent_id == first.snapshot_id
    assert texts(snapshot) == [
        "hello first",
        "Echo: hello first",
        "hello again",
        "Echo: hello again",
    ]
    left = await agent.get_snapshot(snapshot_id=failed.value.snapshot_id)
    assert left is not None and left.status is TurnStatus.FAILED


async def test_a_chat_continuing_from_where_it_is_is_refused_once_the_session_moved(
    app: BankingApp,
) -> None:
    """Snapshot and session together are a compare-and-set: a snapshot that is no longer the
    session's latest is refused as stale, naming the latest, even behind a failed turn."""
    agent = app.banking_agent
    first = await agent.chat().send("hello first")
    with pytest.raises(TurnFailedError) as failed:
        await agent.chat(snapshot_id=first.snapshot_id).send("please fail now")

    with pytest.raises(StaleSnapshotError) as stale:
        await agent.chat(session_id=first.session_id, snapshot_id=first.snapshot_id).send("hi")

    assert stale.value.snapshot_id == failed.value.snapshot_id
    assert stale.value.response is not None  # refused as Genkit answers: a failed output
    latest = await agent.get_snapshot(session_id=first.session_id)
    assert latest is not None and latest.snapshot_id == failed.value.snapshot_id


async def test_only_a_new_message_branches(app: BankingApp) -> None:
    """A resume of an interrupt a later turn answered stays refused (a decision is final),
    and a bare retry of an older snapshot stays refused as stale: nothing runs twice."""
    agent = app.banking_agent
    chat = agent.chat()
    paused = await chat.send("transfer $40 to carol")
    answer = paused.interrupts[0].respond({"approved": True})
    await chat.resume(respond=[answer])
    assert len(app.transfers) == 1

    with pytest.raises(ApprovalNotPendingError):
        await agent.chat(snapshot_id=paused.snapshot_id).resume(respond=[answer])
    before = await agent.chat().send("hello")
    await agent.chat(snapshot_id=before.snapshot_id).send("hello again")
    with pytest.raises(StaleSnapshotError):
        await agent.chat(snapshot_id=before.snapshot_id).send()
    assert len(app.transfers) == 1


async def test_a_new_message_on_a_paused_snapshot_is_refused_branch_or_not(
    app: BankingApp,
) -> None:
    """A message to a snapshot paused at an interrupt is refused whether it is the latest or
    an older one: it must be answered, not talked past."""
    agent = app.banking_agent
    paused = await agent.chat().send("transfer $40 to carol")
    with pytest.raises(SnapshotNotResumableError):
        await agent.chat(snapshot_id=paused.snapshot_id).send("never mind")
    answer = paused.interrupts[0].respond({"approved": False})
    await agent.chat(snapshot_id=paused.snapshot_id).resume(respond=[answer])
    with pytest.raises(SnapshotNotResumableError):
        await agent.chat(snapshot_id=paused.snapshot_id).send("never mind")


async def test_a_branch_outlives_the_pruning_of_its_source_session(
    app: BankingApp, store: SessionStore
) -> None:
    """Retention deleting the source session leaves the branch whole: it keeps its copy of
    the conversation, and only loses its parent reference."""
    agent = app.banking_agent
    root = await agent.chat().send("hello root")
    await agent.chat(snapshot_id=root.snapshot_id).send("hello a")
    await asyncio.sleep(0.05)
    cutoff = datetime.now(UTC)
    await asyncio.sleep(0.05)
    branch = await agent.chat(snapshot_id=root.snapshot_id).send("hello b")

    assert await store.prune_sessions(settled_before=cutoff) == 1

    assert await agent.get_snapshot(session_id=root.session_id) is None
    snapshot = await agent.get_snapshot(snapshot_id=branch.snapshot_id)
    assert snapshot is not None and snapshot.parent_id is None
    assert texts(snapshot) == ["hello root", "Echo: hello root", "hello b", "Echo: hello b"]
    after = await agent.chat(snapshot_id=branch.snapshot_id).send("still here")
    assert after.session_id == branch.session_id
