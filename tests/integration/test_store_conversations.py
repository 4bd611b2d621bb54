"""The SessionStore contract on conversations and snapshots: the messages a turn
continues from (its ancestors' rounds, then its own), and what clients and workers read.

Every test runs on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

import pytest

from engine.conversation.parts import Message, Part
from engine.errors import NotFoundError
from engine.store import RoundRecord, SessionStore, ToolCallStatus
from tests.integration.store_support import (
    COMPLETED,
    FAILED,
    answer,
    asks,
    claim,
    model_says,
    new_turn,
    paused_turn,
    settle,
    tool_call,
    wire,
)

# -- conversations -----------------------------------------------------------------------


async def test_load_conversation_excludes_uncommitted_rounds(store: SessionStore) -> None:
    """load_conversation holds round 0 and the committed rounds only, in round order."""
    hello = Message.user("hello")
    await store.create_turn(new_turn("t1", messages=[hello]))
    token = (await claim(store, "t1")).lease_token
    tool_message = Message(role="tool", content=[Part.of_response("transferMoney", "r1", 1)])
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=2, messages=[asks("r2")], committed=False),
    )
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("r1"), tool_message], committed=True),
    )

    assert wire(await store.load_conversation("t1")) == wire([hello, asks("r1"), tool_message])


async def test_load_conversation_assembles_three_level_chain(store: SessionStore) -> None:
    """A turn's conversation is its parent's truncated to history_length plus its own rounds."""
    question = Message.user("send 10 to bob")
    await store.create_turn(new_turn("root", messages=[question]))
    token = (await claim(store, "root")).lease_token
    paused = asks("r1")
    await store.save_round(
        "root", lease_token=token, round=RoundRecord(round=1, messages=[paused], committed=True)
    )
    await settle(store, "root", COMPLETED, token)
    assert wire(await store.load_conversation("root")) == wire([question, paused])

    amended = Message(
        role="model",
        content=[Part.of_request("transferMoney", "r1", {"amount": 10}, {"resolved": True})],
    )
    answered = Message(role="tool", content=[Part.of_response("transferMoney", "r1", "ok")])
    await store.create_turn(
        new_turn(
            "child", kind="resume", parent_id="root", history_length=1, messages=[amended, answered]
        )
    )
    token = (await claim(store, "child")).lease_token
    for number, messages, committed in [(1, [model_says("sent")], True), (2, [asks("x")], False)]:
        await store.save_round(
            "child",
            lease_token=token,
            round=RoundRecord(round=number, messages=messages, committed=committed),
        )
    await settle(store, "child", COMPLETED, token)
    child_conversation = [question, amended, answered, model_says("sent")]
    assert wire(await store.load_conversation("child")) == wire(child_conversation)

    thanks = Message.user("thanks")
    grandchild = await store.create_turn(
        new_turn("grand", parent_id="child", history_length=4, messages=[thanks])
    )

    assert grandchild.history_length == 4
    child = await store.get_turn("child")
    assert child is not None and child.history_length == 1
    assert wire(await store.load_conversation("grand")) == wire([*child_conversation, thanks])
    assert wire(await store.load_conversation("root")) == wire([question, paused])


async def test_turn_without_rounds_shows_parent_prefix(store: SessionStore) -> None:
    """A turn with no rounds of its own (a retry) holds its parent's first history_length."""
    await store.create_turn(new_turn("root", messages=[Message.user("q")]))
    token = (await claim(store, "root")).lease_token
    await store.save_round(
        "root",
        lease_token=token,
        round=RoundRecord(round=1, messages=[model_says("a"), model_says("b")], committed=True),
    )
    await settle(store, "root", FAILED, token)

    await store.create_turn(new_turn("retry", kind="retry", parent_id="root", history_length=2))

    assert await store.load_rounds("retry") == []
    assert wire(await store.load_conversation("retry")) == wire(
        [Message.user("q"), model_says("a")]
    )


async def test_load_conversation_of_unknown_turn_raises_not_found(store: SessionStore) -> None:
    """load_conversation of an unknown turn raises NotFoundError."""
    with pytest.raises(NotFoundError):
        await store.load_conversation("nope")


async def test_read_snapshot_is_the_turn_with_its_conversation_and_journal(
    store: SessionStore,
) -> None:
    """read_snapshot returns what get_turn, load_conversation and list_calls return, together,
    for a resumed turn whose conversation spans its parent; None for an unknown turn."""
    paused = await paused_turn(store, "root", interrupted=("r2", "r1"))
    await store.create_turn(
        new_turn("child", kind="resume", parent_id="root", history_length=1),
        answers=[answer("root", "r1"), answer("root", "r2")],
    )
    token = (await claim(store, "child")).lease_token
    await settle(store, "child", COMPLETED, token)

    for turn_id in ("root", "child"):
        stored = await store.read_snapshot(turn_id)
        assert stored is not None
        assert stored.turn == await store.get_turn(turn_id)
        assert wire(stored.conversation) == wire(await store.load_conversation(turn_id))
        assert stored.journal == await store.list_calls(turn_id)
    root = await store.read_snapshot("root")
    assert root is not None and root.turn.status is paused.status
    assert [(c.ref, c.status) for c in root.journal] == [
        ("done", ToolCallStatus.DONE),
        ("r1", ToolCallStatus.ANSWERED),
        ("r2", ToolCallStatus.ANSWERED),
    ]
    assert all(c.created_at is not None and c.created_at.tzinfo for c in root.journal)
    assert await store.read_snapshot("nope") is None


async def test_read_progress_is_what_a_worker_reads_to_run_a_turn(store: SessionStore) -> None:
    """read_progress returns the parent's conversation and journal and the turn's own rounds
    (committed or not) and journal, as the separate reads do; a first turn has no parent
    part; an unknown turn gives None."""
    await paused_turn(store, "root", interrupted=("r1",))
    await store.create_turn(
        new_turn("child", kind="resume", parent_id="root", history_length=1),
        answers=[answer("root", "r1")],
    )
    token = (await claim(store, "child")).lease_token
    await store.save_round(
        "child",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("r9"), model_says("x")], committed=False),
        calls=[tool_call("child", 1, "r9", ToolCallStatus.RUNNING)],
    )

    child = await store.read_progress("child")
    assert child is not None
    assert wire(child.parent_conversation) == wire(await store.load_conversation("root"))
    assert child.parent_journal == await store.list_calls("root")
    assert child.rounds == await store.load_rounds("child")
    assert [(r.round, r.committed) for r in child.rounds] == [(1, False)]
    assert child.journal == await store.list_calls("child")
    assert [c.ref for c in child.journal] == ["r9"]
    root = await store.read_progress("root")
    assert root is not None
    assert (root.parent_conversation, root.parent_journal) == ([], [])
    assert root.rounds == await store.load_rounds("root")
    assert await store.read_progress("nope") is None


async def test_read_progress_hands_out_a_copy_the_runner_may_change(store: SessionStore) -> None:
    """What read_progress returns right after a claim (the SQL store keeps it from the claim)
    is the caller's own: the runner answers the paused message in place, and neither the
    stored conversation and journal nor a later read_progress see the change."""
    await paused_turn(store, "root", interrupted=("r1",))
    await store.create_turn(
        new_turn("child", kind="resume", parent_id="root", history_length=1),
        answers=[answer("root", "r1")],
    )
    await claim(store, "child")
    conversation, journal = (
        wire(await store.load_conversation("root")),
        await store.list_calls("root"),
    )

    progress = await store.read_progress("child")
    assert progress is not None and progress.parent_conversation
    paused = progress.parent_conversation[-1]
    paused.content[0].metadata = {"tampered": True}
    paused.content.append(Part.of_text("extra"))
    progress.parent_journal[0].status = ToolCallStatus.FAILED

    assert wire(await store.load_conversation("root")) == conversation
    assert await store.list_calls("root") == journal
    again = await store.read_progress("child")
    assert again is not None
    assert wire(again.parent_conversation) == conversation
    assert again.parent_journal == journal
