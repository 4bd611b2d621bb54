"""Test doubles that stand in for an LLM (never for the database, a server or a process),
a spy that records a real object's calls while they still run, and what tests read of parts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.agent import Agent
from engine.conversation.parts import Message, Part, ToolRequest, ToolResponse
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.store import SessionStore


def ask(*calls: tuple[str, str | None, Any]) -> Message:
    """A model message requesting tools: each call is ``(name, ref, input)``."""
    return Message(role="model", content=[Part.of_request(n, r, i) for n, r, i in calls])


def say(text: str) -> Message:
    """A model message holding text."""
    return Message(role="model", content=[Part.of_text(text)])


def request_in(part: Part) -> ToolRequest:
    """The tool request ``part`` holds (failing the test if it holds none)."""
    assert part.tool_request is not None, part
    return part.tool_request


def response_in(part: Part) -> ToolResponse:
    """The tool response ``part`` holds (failing the test if it holds none)."""
    assert part.tool_response is not None, part
    return part.tool_response


def store_of(agent: Agent) -> SessionStore:
    """The store a server-state agent keeps its sessions in (failing the test if none)."""
    assert agent.store is not None, f"agent {agent.name} keeps its state with the client"
    return agent.store


class ListModel:
    """Answers each model call with the next message of a list (or a function of the request).

    Records every request it received, so tests can check what the model was shown.
    """

    def __init__(self, answers: Sequence[Message | Callable[[ModelRequest], Message]]) -> None:
        self.answers = list(answers)
        self.requests: list[ModelRequest] = []
        self.gate: asyncio.Event | None = None

    @property
    def name(self) -> str:
        return "list"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        if self.gate is not None:
            await self.gate.wait()
        if not self.answers:
            raise AssertionError("ListModel ran out of answers")
        answer = self.answers.pop(0)
        message = answer(request) if callable(answer) else answer
        if on_chunk is not None:
            await on_chunk([p.model_copy(deep=True) for p in message.content])
        return ModelResponse(message=message.model_copy(deep=True))


@dataclass(frozen=True)
class Call:
    """One recorded call: its positional and keyword arguments."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def record_calls(target: object, method: str) -> list[Call]:
    """Record every call of the coroutine method ``target.<method>`` from now on; each call
    still runs (against the real store, database and all)."""
    calls: list[Call] = []
    original: Callable[..., Awaitable[Any]] = getattr(target, method)

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append(Call(args, kwargs))
        return await original(*args, **kwargs)

    setattr(target, method, recorded)
    return calls
