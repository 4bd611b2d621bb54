"""FunctionModel: an agent of one's own, driven offline by a function of the request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from engine import (
    Agent,
    Engine,
    FunctionModel,
    Message,
    ModelRequest,
    ModelResponse,
    Part,
    TurnFailedError,
    TurnStatus,
)
from engine.model import ToolSpec, TransientModelError
from engine.models import ModelError, ModelOutputError
from engine.models.function import ModelFunction
from stores import InMemorySessionStore
from tests.conftest import TEST_STATE_KEYS


class City(BaseModel):
    city: str


class Question(BaseModel):
    question: str


class Answer(BaseModel):
    answer: str


def weather_agent(fn: ModelFunction, **agent_options: Any) -> Agent:
    """An agent with one tool (``weather``) and one interrupt (``askUser``) on ``fn``."""
    ai = Engine(model=FunctionModel(fn), state_keys=TEST_STATE_KEYS)
    ai.define_tool(
        name="weather",
        input_schema=City,
        fn=lambda where: {"city": where.city, "sky": "sunny"},
    )
    ai.define_interrupt(name="askUser", input_schema=Question, output_schema=Answer)
    return ai.define_agent(
        name="weatherAgent",
        system="You report the weather.",
        tools=list(ai.tools.values()),
        store=InMemorySessionStore(),
        **agent_options,
    )


def forecaster(request: ModelRequest) -> ModelResponse:
    """Looks the weather up for the city the user names, then says what it found; asks the
    user for a city when none is named."""
    if report := request.tool_response("weather"):
        return ModelResponse.of_text(f"{report.output['city']}: {report.output['sky']}.")
    if reply := request.tool_response("askUser"):
        return ModelResponse.of_call("weather", City(city=reply.output["answer"]))
    if request.last_user_text.startswith("weather in "):
        return ModelResponse.of_call("weather", {"city": request.last_user_text[11:]})
    return ModelResponse.of_call("askUser", Question(question="Which city?"), ref="ask-1")


async def async_forecaster(request: ModelRequest) -> ModelResponse:
    """:func:`forecaster`, as a coroutine function."""
    return forecaster(request)


async def test_the_model_calls_a_tool_then_replies_with_its_result() -> None:
    """A function answering with a tool call gets the tool's result on its next call, and its
    text reply completes the turn."""
    res = await weather_agent(forecaster).chat().send("weather in Lyon")
    assert res.status is TurnStatus.COMPLETED
    assert res.text == "Lyon: sunny."
    assert [m.role for m in res.messages] == ["user", "model", "tool", "model"]
    [call] = res.messages[1].tool_requests
    assert call.tool_request is not None and call.tool_request.input == {"city": "Lyon"}


async def test_an_interrupt_call_pauses_the_turn_and_resume_continues() -> None:
    """Calling an interrupt pauses the turn with its input; the answer given on resume reaches
    the function, which goes on to the tool and the reply."""
    chat = weather_agent(forecaster).chat()
    paused = await chat.send("what is it like outside?")
    [ask] = paused.interrupts
    assert (ask.name, ask.ref) == ("askUser", "ask-1")
    assert ask.input == Question(question="Which city?")
    res = await chat.resume(respond=[ask.respond({"answer": "Oslo"})])
    assert res.status is TurnStatus.COMPLETED
    assert res.text == "Oslo: sunny."


@pytest.mark.parametrize("fn", [forecaster, async_forecaster], ids=["sync", "async"])
async def test_plain_and_async_functions_both_drive_the_agent(fn: ModelFunction) -> None:
    """A plain function and an ``async`` one are interchangeable."""
    res = await weather_agent(fn).chat().send("weather in Porto")
    assert res.text == "Porto: sunny."


async def test_a_bad_return_value_raises_a_typed_error_naming_what_to_return() -> None:
    """Returning something other than a ModelResponse raises ModelOutputError (a permanent
    ModelError) that says what was returned and how to build a response."""
    model = FunctionModel(lambda request: "sunny", name="sloppy")  # type: ignore[arg-type,return-value]
    with pytest.raises(ModelOutputError) as raised:
        await model.generate(ModelRequest(messages=[Message.user("hi")]))
    error = raised.value
    assert isinstance(error, ModelError) and error.status == "INTERNAL"
    assert "function:sloppy returned str, not a ModelResponse" in error.message
    assert "ModelResponse.of_text(" in error.message
    assert error.details == {"model": "function:sloppy", "returned": "str"}


async def test_a_missing_return_fails_the_turn_with_the_typed_error_message() -> None:
    """A function that forgot its ``return`` fails the turn (INTERNAL) with a message that
    points at the missing return."""

    def forgetful(request: ModelRequest) -> ModelResponse:
        ModelResponse.of_text("never returned")
        return None  # type: ignore[return-value]

    with pytest.raises(TurnFailedError) as failed:
        await weather_agent(forgetful).chat().send("hello")
    assert failed.value.status == "INTERNAL"
    assert "returned NoneType (a missing return?), not a ModelResponse" in failed.value.message


async def test_a_transient_error_from_the_function_is_retried_as_a_providers() -> None:
    """A TransientModelError from the function is retried like a provider's, so a function can
    rehearse an agent's failure paths."""
    calls: list[str] = []

    def flaky(request: ModelRequest) -> ModelResponse:
        calls.append(request.last_user_text)
        if len(calls) == 1:
            raise TransientModelError("rate limited")
        return ModelResponse.of_text("fine")

    res = await weather_agent(flaky, max_attempts=2).chat().send("hello")
    assert res.text == "fine"
    assert calls == ["hello", "hello"]


async def test_the_answer_streams_as_one_chunk_of_its_parts() -> None:
    """The whole answer arrives as one chunk holding the same parts as the final message."""
    chunks: list[list[Part]] = []

    async def sink(parts: list[Part]) -> None:
        chunks.append(parts)

    answer = ModelResponse.of_parts("Checking. ", Part.of_request("weather", "w1", {"city": "A"}))
    model = FunctionModel(lambda request: answer)
    response = await model.generate(ModelRequest(messages=[Message.user("x")]), sink)
    assert response is answer
    assert [[p.to_wire() for p in chunk] for chunk in chunks] == [
        [p.to_wire() for p in answer.message.content]
    ]


async def test_the_function_cannot_change_the_conversation_it_reads() -> None:
    """The function gets a copy of the request: editing it leaves the caller's intact."""

    def vandal(request: ModelRequest) -> ModelResponse:
        request.messages[0].content[0].text = "rewritten"
        request.tools[0].name = "renamed"
        return ModelResponse.of_text("ok")

    original = ModelRequest(messages=[Message.user("mine")], tools=[ToolSpec(name="weather")])
    await FunctionModel(vandal).generate(original)
    assert original.messages[0].text == "mine"
    assert original.tools[0].name == "weather"


def test_the_model_is_named_after_its_function_unless_named() -> None:
    """The name recorded on turns is ``function:`` and the function's name, or the one given."""
    assert FunctionModel(forecaster).name == "function:forecaster"
    assert FunctionModel(forecaster, name="weather-bot").name == "function:weather-bot"


def test_request_readers_see_the_newest_user_text_and_tool_results() -> None:
    """``last_user_text`` outlives tool rounds; ``tool_responses`` are only the newest tool
    message's, and ``tool_response`` picks one by tool name or tool object."""
    tool_message = Message(
        role="tool",
        content=[
            Part.of_response("weather", "w1", {"sky": "grey"}),
            Part.of_response("askUser", "a1", {"answer": "Rome"}),
        ],
    )
    asked = ModelRequest(messages=[Message.user("first"), Message.user("second")])
    assert asked.last_user_text == "second"
    assert asked.tool_responses == [] and asked.tool_response("weather") is None
    told = ModelRequest(
        messages=[Message.user("second"), Message(role="model"), tool_message],
    )
    assert told.last_user_text == "second"
    assert [r.name for r in told.tool_responses] == ["weather", "askUser"]
    answered = told.tool_response(ToolSpec(name="askUser"))
    assert answered is not None and answered.output == {"answer": "Rome"}
    assert ModelRequest(messages=[]).last_user_text == ""


@pytest.mark.parametrize(
    ("build", "wire"),
    [
        (lambda: ModelResponse.of_text("hi"), [{"text": "hi"}]),
        (
            lambda: ModelResponse.of_call(ToolSpec(name="weather"), City(city="Nice")),
            [{"toolRequest": {"name": "weather", "input": {"city": "Nice"}}}],
        ),
        (
            lambda: ModelResponse.of_parts("a", Part.of_request("weather", "w", None)),
            [{"text": "a"}, {"toolRequest": {"name": "weather", "ref": "w", "input": None}}],
        ),
    ],
    ids=["text", "call", "parts"],
)
def test_response_builders_make_a_model_message_that_stops(
    build: Callable[[], ModelResponse], wire: list[dict[str, Any]]
) -> None:
    """Each builder gives a ``model`` message with the parts asked for and finish ``stop``."""
    response = build()
    assert response.message.role == "model"
    assert [p.to_wire() for p in response.message.content] == wire
    assert response.finish_reason == "stop"
