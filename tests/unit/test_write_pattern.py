"""When a turn's progress is written: what a crash can lose, and what it never can.

A round whose tools have effects is written (with its journal rows) before any tool runs, so
a crash never loses a started effect. A round that is a single interrupt runs nothing, so it
is written once, with the settling transition; a crash before that write loses only the
model's answer, which recovery asks for again. Likewise the round 0 of a resume answered
only by respond runs nothing: it is written by the turn's next write, and a crash before
that loses nothing recovery cannot build again from the turn's input.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine import Engine, TurnStatus
from engine.conversation.parts import Message
from engine.errors import AgentError, TurnFailedError
from engine.model import ModelRequest
from engine.store import ToolCallStatus, Transition, TurnRecord
from stores import InMemorySessionStore
from tests.support import ListModel, ask, say


class RecordingStore(InMemorySessionStore):
    """The in-memory store, noting each write of a turn's progress in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[Any, ...]] = []

    async def save_round(self, turn_id: str, **kwargs: Any) -> None:
        round, earlier = kwargs["round"], kwargs.get("earlier")
        calls = [(c.ref, c.status.value) for c in kwargs.get("calls", ())]
        self.writes.append(
            ("save_round", round.round, round.committed, calls, earlier.round if earlier else None)
        )
        await super().save_round(turn_id, **kwargs)

    async def record_call(self, turn_id: str, **kwargs: Any) -> None:
        self.writes.append(("record_call", kwargs["call"].ref, kwargs["call"].status.value))
        await super().record_call(turn_id, **kwargs)

    async def transition(self, turn_id: str, change: Transition) -> TurnRecord:
        round = change.round
        calls = [(c.ref, c.status.value) for c in change.calls]
        self.writes.append(("transition", change.new.value, round.round if round else None, calls))
        return await super().transition(turn_id, change)


def engine_with(model: ListModel, store: RecordingStore) -> tuple[Engine, list[str]]:
    ai = Engine(model=model, state_keys={"k": "secret-secret-secret"})
    effects: list[str] = []

    @ai.tool(name="pay")
    async def pay(data: dict[str, Any]) -> dict[str, Any]:
        effects.append("pay")
        return {"paid": data["amount"]}

    ai.define_agent(name="payer", tools=[pay, ai.define_interrupt(name="approve")], store=store)
    return ai, effects


async def test_a_round_that_is_one_interrupt_is_written_with_the_settle() -> None:
    """A send that pauses at one interrupt writes its round and the interrupted journal row in
    the settling transition, and nothing before it."""
    store = RecordingStore()
    ai, _ = engine_with(ListModel([ask(("approve", "a1", {"amount": 5}))]), store)

    paused = await ai.agents["payer"].chat().send("pay 5")

    assert paused.finish_reason == "interrupted"
    assert store.writes == [("transition", "completed", 1, [("a1", "interrupted")])]
    (row,) = await store.list_calls(str(paused.snapshot_id))
    assert row.status is ToolCallStatus.INTERRUPTED


async def test_a_round_with_an_effect_is_written_before_the_tool_runs() -> None:
    """A round calling a tool with an effect is saved open, its call journaled running, before
    the tool runs; its close and the settle follow."""
    store = RecordingStore()
    ai, effects = engine_with(ListModel([ask(("pay", "p1", {"amount": 5})), say("paid")]), store)

    original = store.save_round

    async def save_round(turn_id: str, **kwargs: Any) -> None:
        if not kwargs["round"].committed:
            assert effects == [], "the round was written after its tool ran"
        await original(turn_id, **kwargs)

    store.save_round = save_round  # type: ignore[method-assign]
    done = await ai.agents["payer"].chat().send("pay 5")

    assert done.text == "paid" and effects == ["pay"]
    assert [w[:3] for w in store.writes] == [
        ("save_round", 1, False),
        ("save_round", 1, True),
        ("transition", "completed", 2),
    ]
    assert store.writes[0][3] == [("p1", "running")]
    assert store.writes[1][3] == [("p1", "done")]


async def test_a_round_of_two_interrupts_is_still_opened_first() -> None:
    """With two interrupts in one round the round opens as before: only a single interrupt is
    left to the settle."""
    store = RecordingStore()
    model = ListModel([ask(("approve", "a1", {"n": 1}), ("approve", "a2", {"n": 2}))])
    ai, _ = engine_with(model, store)

    paused = await ai.agents["payer"].chat().send("two")

    assert [i.ref for i in paused.interrupts] == ["a1", "a2"]
    assert store.writes[0][:3] == ("save_round", 1, False)
    assert store.writes[-1][:2] == ("transition", "completed")
    turn = await store.get_turn(str(paused.snapshot_id))
    assert turn is not None and turn.status is TurnStatus.COMPLETED


class SignallingModel(ListModel):
    """A ListModel that also sets ``asked`` whenever a call arrives."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__(answers)
        self.asked = asyncio.Event()

    async def generate(self, request: ModelRequest, on_chunk: Any = None) -> Any:
        self.asked.set()
        return await super().generate(request, on_chunk)


async def paused_payer(
    store: RecordingStore, *later: Any
) -> tuple[Engine, list[str], tuple[Any, Any, SignallingModel]]:
    """A payer chat paused at its approval; the model then answers with ``later``."""
    model = SignallingModel([ask(("approve", "a1", {"amount": 5})), *later])
    ai, effects = engine_with(model, store)
    chat = ai.agents["payer"].chat()
    paused = await chat.send("pay 5")
    store.writes.clear()
    return ai, effects, (chat, paused, model)


async def test_a_resume_answered_by_respond_is_written_with_the_next_rounds_opening() -> None:
    """Round 0 of a resume that runs nothing costs no write of its own: it is written with
    the next round's opening (same transaction), still before that round's tool runs."""
    store = RecordingStore()
    _, effects, (chat, paused, _) = await paused_payer(
        store, ask(("pay", "p1", {"amount": 5})), say("paid")
    )

    done = await chat.resume(respond=[paused.interrupts[0].respond({"ok": True})])

    assert done.text == "paid" and effects == ["pay"]
    assert store.writes == [
        ("save_round", 1, False, [("a1", "done"), ("p1", "running")], 0),
        ("save_round", 1, True, [("p1", "done")], None),
        ("transition", "completed", 2, []),
    ]
    rounds = await store.load_rounds(str(done.snapshot_id))
    assert [(r.round, len(r.messages), r.committed) for r in rounds] == [
        (0, 2, True),
        (1, 2, True),
        (2, 1, True),
    ]


async def test_a_resume_whose_model_then_fails_still_writes_its_answered_round() -> None:
    """With no next round to carry it (the model fails), round 0 is written on its own before
    the turn settles failed: the failed snapshot holds the answer, ready for a retry."""

    def unavailable(_: ModelRequest) -> Message:
        raise AgentError("model unavailable", status="UNAVAILABLE")

    store = RecordingStore()
    _, _, (chat, paused, _) = await paused_payer(store, unavailable)

    with pytest.raises(TurnFailedError) as failed:
        await chat.resume(respond=[paused.interrupts[0].respond({"ok": True})])

    assert store.writes[0] == ("save_round", 0, True, [("a1", "done")], None)
    assert store.writes[-1][:2] == ("transition", "failed")
    conversation = await store.load_conversation(str(failed.value.snapshot_id))
    assert [m.role for m in conversation[-2:]] == ["model", "tool"]


async def test_an_abort_during_the_next_model_call_keeps_the_answered_round() -> None:
    """Aborted while the model answers after the resume: round 0 was completed, so the
    aborted snapshot keeps it (as it did when round 0 had a write of its own)."""
    store = RecordingStore()
    _, effects, (chat, paused, model) = await paused_payer(store, say("never seen"))
    model.gate, model.asked = asyncio.Event(), asyncio.Event()  # hold the next call

    resuming = asyncio.create_task(
        chat.resume(respond=[paused.interrupts[0].respond({"ok": True})])
    )
    await model.asked.wait()
    assert await chat.abort() is TurnStatus.PENDING
    aborted = await resuming

    assert aborted.status is TurnStatus.ABORTED and effects == []
    assert ("save_round", 0, True, [("a1", "done")], None) in store.writes
    assert store.writes[-1][:2] == ("transition", "aborted")
    conversation = await store.load_conversation(str(aborted.snapshot_id))
    assert [m.role for m in conversation[-2:]] == ["model", "tool"]
