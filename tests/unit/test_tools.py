"""Defining tools and interrupts: signatures, schemas, validation and failures."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from engine import Engine, Message, Part, ToolContext, TurnFailedError
from engine.conversation.parts import MALFORMED_INPUT, TOOL_ERROR
from engine.store import ToolCallStatus
from stores import InMemorySessionStore
from tests.support import ListModel, ask, response_in, say, store_of

KEYS = {"k": "secret-secret-secret"}


class Point(BaseModel):
    """A tool input."""

    x: int
    y: int


class Sum(BaseModel):
    """A tool output."""

    total: int


def engine_with(*answers: Any) -> Engine:
    """An engine whose model answers with ``answers`` in order."""
    return Engine(model=ListModel(list(answers)), state_keys=KEYS)


async def run(ai: Engine, *tools: Any, message: str = "go") -> Any:
    """Send one message to a fresh agent holding ``tools``."""
    agent = ai.define_agent(name="a", tools=list(tools), store=InMemorySessionStore())
    return await agent.chat().send(message)


async def test_decorated_tool_gets_typed_input_and_may_omit_ctx() -> None:
    """@ai.tool uses the function's name and docstring; fn(input) receives a schema instance."""
    ai = engine_with(ask(("add", "r1", {"x": 2, "y": 3})), say("ok"))
    seen: list[Any] = []

    @ai.tool(input_schema=Point, output_schema=Sum)
    def add(point: Point) -> Sum:
        """Add the coordinates."""
        seen.append(point)
        return Sum(total=point.x + point.y)

    assert add.name == "add" and add.description == "Add the coordinates."
    schema = add.spec().input_schema
    assert schema is not None and schema["properties"].keys() == {"x", "y"}
    res = await run(ai, add)
    assert seen == [Point(x=2, y=3)]
    assert res.messages[2].content[0].tool_response.output == {"total": 5}


async def test_async_tool_receives_context_with_stable_key() -> None:
    """An async fn(input, ctx) sees its ref, turn, session and idempotency key."""
    ai = engine_with(ask(("probe", "r1", {})), say("ok"))
    contexts: list[ToolContext] = []

    async def probe(_: Any, ctx: ToolContext) -> dict[str, str]:
        contexts.append(ctx)
        return {"key": ctx.idempotency_key}

    res = await run(ai, ai.define_tool(name="probe", fn=probe))
    ctx = contexts[0]
    assert (ctx.name, ctx.ref, ctx.session_id, ctx.resumed) == ("probe", "r1", res.session_id, None)
    assert ctx.idempotency_key == f"{res.snapshot_id}:r1"


async def test_json_schema_dicts_are_accepted_and_enforced() -> None:
    """Input violating a JSON-schema dict goes back to the model as a tool error, and the
    tool runs only once the model corrects its call."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    model = ListModel(
        [ask(("count", "r1", {"n": "three"})), ask(("count", "r2", {"n": 3})), say("ok")]
    )
    ai = Engine(model=model, state_keys=KEYS)
    ran: list[Any] = []

    def count(given: Any) -> Any:
        ran.append(given)
        return given

    tool = ai.define_tool(name="count", input_schema=schema, fn=count)
    agent = ai.define_agent(name="a", tools=[tool], store=InMemorySessionStore())
    res = await agent.chat().send("go")
    assert res.text == "ok"
    assert ran == [{"n": 3}]
    rejected = res.messages[2].content[0]
    assert rejected.metadata == {TOOL_ERROR: True}
    assert (
        response_in(rejected)
        .output["error"]
        .startswith("Tool 'count' was called with input that does not match its input schema")
    )
    assert model.requests[1].messages[-1].content[0] == rejected
    assert res.snapshot_id is not None
    calls = await store_of(agent).list_calls(res.snapshot_id)
    assert [(c.ref, c.status) for c in calls] == [
        ("r1", ToolCallStatus.FAILED),
        ("r2", ToolCallStatus.DONE),
    ]
    assert calls[0].error is not None and calls[0].error.status == "INVALID_ARGUMENT"


async def test_malformed_calls_are_bounded_by_max_turns() -> None:
    """A model that never corrects its call fails the turn at max_turns, not in a loop."""
    model = ListModel([ask(("count", None, {"n": "x"}))] * 3)
    ai = Engine(model=model, state_keys=KEYS)
    tool = ai.define_tool(name="count", input_schema=Point, fn=lambda p: p)
    agent = ai.define_agent(name="a", tools=[tool], store=InMemorySessionStore(), max_turns=2)
    with pytest.raises(TurnFailedError) as failed:
        await agent.chat().send("go")
    assert failed.value.status == "ABORTED"
    assert "Exceeded maximum tool call iterations (2)" in failed.value.message
    assert len(model.requests) == 3


async def test_non_json_arguments_marked_by_an_adapter_become_a_tool_error() -> None:
    """A toolRequest marked malformedInput (raw, unparsable arguments) is answered with an
    error naming the parse problem; an interrupt called that way does not pause."""
    bad = Part.of_request("ask", "r1", '{"x": ', {MALFORMED_INPUT: "Expecting value"})
    model = ListModel([Message(role="model", content=[bad]), say("sorry")])
    ai = Engine(model=model, state_keys=KEYS)
    interrupt = ai.define_interrupt(name="ask", input_schema=Point)
    agent = ai.define_agent(name="a", tools=[interrupt], store=InMemorySessionStore())
    res = await agent.chat().send("go")
    assert res.interrupts == [] and res.text == "sorry"
    output = response_in(res.messages[2].content[0]).output
    assert "not valid JSON (Expecting value)" in output["error"]


async def test_output_violating_the_schema_fails_the_turn() -> None:
    """A tool returning output outside its schema fails the turn naming the tool."""
    ai = engine_with(ask(("bad", "r1", {})))
    tool = ai.define_tool(name="bad", output_schema=Sum, fn=lambda _: {"total": "lots"})
    with pytest.raises(TurnFailedError) as failed:
        await run(ai, tool)
    assert (
        "Tool 'bad' returned output that does not match its output schema" in failed.value.message
    )


async def test_tool_exception_fails_the_turn_and_is_journaled() -> None:
    """A raising tool fails the turn (INTERNAL) and its journal row records the error."""
    ai = engine_with(ask(("boom", "r1", {})))

    def boom(_: Any) -> None:
        raise RuntimeError("kaboom")

    agent = ai.define_agent(
        name="a", tools=[ai.define_tool(name="boom", fn=boom)], store=InMemorySessionStore()
    )
    with pytest.raises(TurnFailedError) as failed:
        await agent.chat().send("go")
    assert (failed.value.status, failed.value.message) == ("INTERNAL", "Tool 'boom' failed: kaboom")
    assert failed.value.snapshot_id is not None
    [call] = await store_of(agent).list_calls(failed.value.snapshot_id)
    assert call.status is ToolCallStatus.FAILED
    assert call.error is not None and call.error.message.endswith("kaboom")


async def test_unknown_tool_fails_the_turn_with_not_found() -> None:
    """A request for a tool the agent does not have fails with NOT_FOUND before anything runs."""
    ai = engine_with(ask(("ghost", "r1", {})))
    with pytest.raises(TurnFailedError) as failed:
        await run(ai)
    assert (failed.value.status, failed.value.message) == ("NOT_FOUND", "Tool 'ghost' not found")


async def test_interrupt_cannot_be_swallowed_by_a_broad_except() -> None:
    """ctx.interrupt() pauses even inside `except Exception` (it is not an Exception)."""
    ai = engine_with(ask(("careful", "r1", {})))

    def careful(_: Any, ctx: ToolContext) -> dict[str, bool]:
        try:
            ctx.interrupt({"why": "check"})
        except Exception:
            return {"swallowed": True}
        return {"swallowed": False}

    res = await run(ai, ai.define_tool(name="careful", fn=careful))
    assert [i.metadata for i in res.interrupts] == [{"why": "check"}]


def test_duplicate_names_are_rejected() -> None:
    """Tools and agents are registered once per name."""
    ai = engine_with()
    ai.define_tool(name="t", fn=lambda i: i)
    with pytest.raises(ValueError, match="already defined"):
        ai.define_interrupt(name="t")
    ai.define_agent(name="x")
    with pytest.raises(ValueError, match="already defined"):
        ai.define_agent(name="x")


def test_schema_must_be_a_model_or_a_json_schema() -> None:
    """Anything else as a schema is a TypeError at definition time."""
    ai = engine_with()
    with pytest.raises(TypeError):
        ai.define_tool(name="t", input_schema=int, fn=lambda i: i)  # type: ignore[arg-type]
