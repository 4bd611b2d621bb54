"""Forking a turn (engine/fork.py) on the in-memory store: a new session that continues a
turn's conversation after one of its completed rounds, without touching the source."""

from __future__ import annotations

import pytest

from engine.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from engine.fork import continuable_rounds, fork_turn
from examples.banking import build


async def test_a_fork_after_the_tool_round_answers_without_running_the_tool_again() -> None:
    app = build()
    agent = app.banking_agent
    chat = agent.chat()
    paused = await chat.send("transfer $40 to carol")
    done = await chat.resume(respond=[paused.interrupts[0].respond({"approved": True})])
    assert done.text == "Done. Transaction txn-40-carol."
    assert len(app.transfers) == 1

    forked = await fork_turn(agent, str(done.snapshot_id), round=1, wait=True)
    assert forked.text == "Done. Transaction txn-40-carol."
    assert forked.session_id != done.session_id
    assert len(app.transfers) == 1  # the copied round is history: nothing ran again
    assert agent.store is not None
    turn = await agent.store.get_turn(str(forked.snapshot_id))
    assert turn is not None and turn.parent_id is None
    assert (turn.input.kind, turn.input.forked_from, turn.input.fork_round) == (
        "fork",
        done.snapshot_id,
        1,
    )
    assert [m.role for m in forked.messages] == [m.role for m in done.messages]
    # The source and its session are as they were.
    latest = await agent.store.latest_turn(done.session_id)
    assert latest is not None and latest.id == done.snapshot_id


async def test_the_default_round_is_the_last_the_model_can_continue() -> None:
    app = build()
    agent = app.banking_agent
    chat = agent.chat()
    paused = await chat.send("transfer $40 to carol")
    done = await chat.resume(respond=[paused.interrupts[0].respond({"approved": True})])
    assert agent.store is not None
    rounds = await agent.store.load_rounds(str(done.snapshot_id))
    assert continuable_rounds(rounds) == [0, 1]  # round 2 is the model's final answer
    forked = await fork_turn(agent, str(done.snapshot_id), wait=True)
    turn = await agent.store.get_turn(str(forked.snapshot_id))
    assert turn is not None and turn.input.fork_round == 1

    # After round 0 (the approval's answer) the model asks for the transfer again: a
    # replay, under the fork's own idempotency key.
    replay = await fork_turn(agent, str(done.snapshot_id), round=0, wait=True)
    assert replay.text == "Done. Transaction txn-40-carol."
    assert [key.split(":")[0] for key, _ in app.transfers][1] == replay.snapshot_id


async def test_rounds_that_cannot_be_continued_are_refused() -> None:
    agent = build().banking_agent
    paused = await agent.chat().send("transfer $40 to carol")
    snapshot = str(paused.snapshot_id)
    with pytest.raises(FailedPreconditionError, match="ends with the model's answer"):
        await fork_turn(agent, snapshot, round=1)  # it paused there
    with pytest.raises(InvalidArgumentError, match="no completed round 4"):
        await fork_turn(agent, snapshot, round=4)
    first = await fork_turn(agent, snapshot, round=0, wait=True)  # the user's message
    assert first.interrupts and first.session_id != paused.session_id
    with pytest.raises(NotFoundError):
        await fork_turn(agent, "no-such-turn")
    with pytest.raises(FailedPreconditionError, match="client-managed"):
        await fork_turn(build().banking_agent_stateless, snapshot)
