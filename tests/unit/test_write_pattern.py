"""When a turn's progress is written: what a crash can lose, and what it never can.

A round whose tools have effects is written (with its journal rows) before any tool runs, so
a crash never loses a started effect. A round that is a single interrupt runs nothing, so it
is written once, with the settling transition; a crash before that write loses only the
model's answer, which recovery asks for again.
"""

from __future__ import annotations

from typing import Any

from engine import Engine, TurnStatus
from engine.store import ToolCallStatus, TurnRecord
from stores import InMemorySessionStore
from tests.support import ListModel, ask, say


class RecordingStore(InMemorySessionStore):
    """The in-memory store, noting each write of a turn's progress in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[Any, ...]] = []

    async def save_round(self, turn_id: str, **kwargs: Any) -> None:
        round = kwargs["round"]
        calls = [(c.ref, c.status.value) for c in kwargs.get("calls", ())]
        self.writes.append(("save_round", round.round, round.committed, calls))
        await super().save_round(turn_id, **kwargs)

    async def record_call(self, turn_id: str, **kwargs: Any) -> None:
        self.writes.append(("record_call", kwargs["call"].ref, kwargs["call"].status.value))
        await super().record_call(turn_id, **kwargs)

    async def transition(self, turn_id: str, **kwargs: Any) -> TurnRecord:
        round = kwargs.get("round")
        calls = [(c.ref, c.status.value) for c in kwargs.get("calls", ())]
        new = kwargs["new"].value
        self.writes.append(("transition", new, round.round if round else None, calls))
        return await super().transition(turn_id, **kwargs)


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
