"""Genkit's custom session state and artifacts on the local API, on every store, beyond
what Genkit's agent spec asks (its eight cases run in ``test_genkit_spec.py``): the state
schema, failures, interrupts, the wire form, client blobs and forks. Genkit's custom agents
mutate the state in their handler; ours do it from a tool, where a Turnstile agent's code
runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from engine import Engine, Message, ToolContext, TurnStatus
from engine.agent import Agent
from engine.conversation.session_state import StateSchemaError
from engine.errors import InvalidStateError, TurnFailedError
from engine.fork import fork_turn
from engine.response import AgentChunk
from engine.store import SessionStore
from tests.support import ListModel, ask, say

KEYS = {"k": "secret-secret-secret-secret"}


def _counter(_: Any, ctx: ToolContext) -> str:
    ctx.update_state(lambda s: {"counter": ((s or {}).get("counter") or 0) + 1})
    return "counted"


def _agent(
    store: SessionStore | None,
    fn: Callable[[Any, ToolContext], Any],
    turns: int = 1,
    **options: Any,
) -> Agent:
    """An agent whose model calls ``fn`` once per turn, then answers ``done``."""
    answers: list[Message] = []
    for _ in range(turns):
        answers += [ask(("work", None, {})), say("done")]
    ai = Engine(model=ListModel(answers), state_keys=KEYS)
    tool = ai.define_tool(name="work", fn=fn)
    return ai.define_agent(
        name="stateful", tools=[tool], store=store, execution="inline", **options
    )


class Counter(BaseModel):
    """The state schema of the schema tests."""

    counter: int


async def test_update_breaking_the_state_schema_fails_the_turn(store: SessionStore) -> None:
    """An update that breaks ``state_schema`` is a typed error; the turn fails and keeps the
    state of its last completed round."""

    def breaks(_: Any, ctx: ToolContext) -> str:
        ctx.update_state({"counter": "many"})
        return "unreachable"

    ai = Engine(
        model=ListModel([ask(("count", None, {})), say("ok"), ask(("breaks", None, {}))]),
        state_keys=KEYS,
    )
    tools = [ai.define_tool(name="count", fn=_counter), ai.define_tool(name="breaks", fn=breaks)]
    agent = ai.define_agent(
        name="typed", tools=tools, store=store, execution="inline", state_schema=Counter
    )
    chat = agent.chat()
    assert (await chat.send("count")).custom == {"counter": 1}
    with pytest.raises(TurnFailedError) as failed:
        await chat.send("break it")
    assert failed.value.status == "INVALID_ARGUMENT"
    assert "state schema" in failed.value.message
    snapshot = await agent.get_snapshot(snapshot_id=failed.value.snapshot_id)
    assert snapshot is not None and snapshot.status is TurnStatus.FAILED
    assert snapshot.state.custom == {"counter": 1}


async def test_a_caught_schema_error_changes_nothing(store: SessionStore) -> None:
    """A tool that catches the schema error goes on, and the bad value was never applied."""

    def careful(_: Any, ctx: ToolContext) -> str:
        ctx.update_state({"counter": 5})
        with contextlib.suppress(StateSchemaError):
            ctx.update_state({"counter": "many"})
        return "kept"

    ai = Engine(model=ListModel([ask(("careful", None, {})), say("ok")]), state_keys=KEYS)
    agent = ai.define_agent(
        name="typed",
        tools=[ai.define_tool(name="careful", fn=careful)],
        store=store,
        execution="inline",
        state_schema=Counter,
    )
    assert (await agent.chat().send("go")).custom == {"counter": 5}


async def test_failed_turn_keeps_state_of_last_completed_round(store: SessionStore) -> None:
    """Round 1's change is committed with round 1; round 2's change dies with its failed
    round, so the failed turn shows round 1's state."""

    def fails(_: Any, ctx: ToolContext) -> str:
        ctx.update_state(lambda s: {**s, "lost": True})
        raise RuntimeError("tool broke")

    ai = Engine(
        model=ListModel([ask(("count", None, {})), ask(("fails", None, {}))]),
        state_keys=KEYS,
    )
    tools = [ai.define_tool(name="count", fn=_counter), ai.define_tool(name="fails", fn=fails)]
    agent = ai.define_agent(name="fragile", tools=tools, store=store, execution="inline")
    with pytest.raises(TurnFailedError) as failed:
        await agent.chat().send("go")
    assert failed.value.response is not None
    assert failed.value.response.custom == {"counter": 1}
    snapshot = await agent.get_snapshot(snapshot_id=failed.value.snapshot_id)
    assert snapshot is not None and snapshot.state.custom == {"counter": 1}


async def test_state_survives_an_interrupt_and_its_resume(store: SessionStore) -> None:
    """A change made in the round that paused is kept by the paused snapshot, and the resumed
    turn's tools build on it."""

    def asks(_: Any, ctx: ToolContext) -> None:
        if ctx.resumed is None:
            ctx.update_state({"asked": 1})
            ctx.interrupt({"question": "sure?"})
        ctx.update_state(lambda s: {**s, "asked": s["asked"] + 1})

    ai = Engine(model=ListModel([ask(("asks", "a1", {})), say("done")]), state_keys=KEYS)
    agent = ai.define_agent(
        name="asking",
        tools=[ai.define_tool(name="asks", fn=asks)],
        store=store,
        execution="inline",
    )
    chat = agent.chat()
    paused = await chat.send("go")
    assert paused.interrupts and paused.custom == {"asked": 1}
    resumed = await chat.resume(restart=[paused.interrupts[0].restart()])
    assert resumed.custom == {"asked": 2}


def test_chunks_round_trip_through_the_wire_form() -> None:
    """State chunks keep their kind through ``to_wire`` / ``from_wire`` (the relay's path)."""
    patch = {"customPatch": [{"op": "replace", "path": "", "value": {"a": 1}}]}
    artifact = {"artifact": {"name": "x", "parts": [{"text": "y"}]}}
    for wire in (patch, artifact):
        assert AgentChunk.from_wire(wire).to_wire() == wire


async def test_a_client_state_with_an_edited_custom_is_refused() -> None:
    """The signature covers custom and artifacts: an edited blob is refused before anything
    runs, like one with edited messages."""
    agent = _agent(None, _counter, turns=2)
    first = await agent.chat().send("first")
    assert first.state is not None
    forged_artifact = [{"name": "forged", "parts": [{"text": "x"}]}]
    for field, value in (("custom", {"counter": 1000}), ("artifacts", forged_artifact)):
        with pytest.raises(InvalidStateError):
            agent.chat(state={**first.state, field: value})


async def test_a_fork_opens_with_the_state_as_of_its_round(store: SessionStore) -> None:
    """Forking after round 1 gives the new session round 1's state, not the source's final
    one (the source's round 2 changed it again)."""
    ai = Engine(
        model=ListModel(
            [ask(("count", "c1", {})), ask(("count", "c2", {})), say("done"), say("forked")]
        ),
        state_keys=KEYS,
    )
    agent = ai.define_agent(
        name="forking",
        tools=[ai.define_tool(name="count", fn=_counter)],
        store=store,
        execution="inline",
    )
    first = await agent.chat().send("first")
    assert first.custom == {"counter": 2}
    fork = await fork_turn(agent, str(first.snapshot_id), round=1, wait=True)
    assert fork.custom == {"counter": 1}
    snapshot = await agent.get_snapshot(snapshot_id=fork.snapshot_id)
    assert snapshot is not None and snapshot.state.custom == {"counter": 1}
