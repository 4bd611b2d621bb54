"""The model protocol the turn runner calls.

A model is asynchronous and streams: it receives a :class:`ModelRequest` (the agent's system
message first, then the conversation, plus the tools it may call) and an optional chunk sink,
pushes content deltas into the sink as it produces them, and returns the complete
:class:`ModelResponse`. Adapters for real providers (OpenAI, Anthropic) implement the same
protocol; :class:`~engine.scripted.ScriptedModel` is the offline, deterministic one, and
:class:`~engine.models.function.FunctionModel` the offline one you program yourself.

A request has readers for what a model usually looks at (``last_user_text``,
``tool_responses``), and a response has builders (``ModelResponse.of_text``, ``of_call``,
``of_parts``), so that a hand-written model reads as a few lines of plain decisions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import BaseModel, BeforeValidator, Field

from engine.conversation.parts import Message, Part, ToolRequest, ToolResponse
from engine.errors import TransientError
from engine.status import FinishReason

__all__ = [
    "ChunkSink",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelUsage",
    "NamedTool",
    "ToolSpec",
    "TransientModelError",
]


class ToolSpec(BaseModel):
    """What a model is told about one tool (interrupts are offered as ordinary tools)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None


class NamedTool(Protocol):
    """Anything with a tool's name: a :class:`~engine.tools.Tool`, an
    :class:`~engine.tools.InterruptTool` or a :class:`ToolSpec` (so a hand-written model can
    name the tool objects it was built with instead of repeating their names as strings)."""

    @property
    def name(self) -> str:
        """The tool's name, as the model calls it."""
        ...


def _tool_name(tool: str | NamedTool) -> str:
    return tool if isinstance(tool, str) else tool.name


class ModelRequest(BaseModel):
    """One model call: ``messages`` start with the system message when the agent has one."""

    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)

    @property
    def last_user_text(self) -> str:
        """The text of the newest ``user`` message ('' when there is none).

        It stays the same while the model works through tool rounds, so it still says what
        the user asked for when the newest message is a tool message.
        """
        for message in reversed(self.messages):
            if message.role == "user":
                return message.text
        return ""

    @property
    def tool_responses(self) -> list[ToolResponse]:
        """What the model's previous tool requests returned, when the newest message is the
        ``tool`` message answering them (else ``[]``: the model is answering the user)."""
        if not self.messages or self.messages[-1].role != "tool":
            return []
        return [p.tool_response for p in self.messages[-1].content if p.tool_response is not None]

    def tool_response(self, tool: str | NamedTool) -> ToolResponse | None:
        """The first of :attr:`tool_responses` from ``tool`` (a name or a tool object);
        ``None`` when that tool is not among them."""
        name = _tool_name(tool)
        return next((r for r in self.tool_responses if r.name == name), None)


class ModelUsage(BaseModel):
    """Token counts reported by the provider, when it reports them."""

    input_tokens: int | None = None
    output_tokens: int | None = None


def _known_finish(reason: Any) -> Any:
    """A finish reason outside Genkit's set (a provider's own) counts as ``other``."""
    if isinstance(reason, str) and reason not in FinishReason.__members__.values():
        return FinishReason.OTHER
    return reason


class ModelResponse(BaseModel):
    """The complete answer of one model call. ``finish_reason`` takes Genkit's values (a
    string is read as one; an unknown one is ``other``)."""

    message: Message
    finish_reason: Annotated[FinishReason, BeforeValidator(_known_finish)] = FinishReason.STOP
    usage: ModelUsage | None = None

    @classmethod
    def of_text(cls, text: str) -> ModelResponse:
        """A plain answer: ``text`` as the model's whole message (the turn completes with it
        unless the model is called again)."""
        return cls.of_parts(text)

    @classmethod
    def of_call(
        cls, tool: str | NamedTool, input: Any = None, *, ref: str | None = None
    ) -> ModelResponse:
        """A request to call one tool — or an interrupt: to a model an interrupt is a tool like
        any other, and calling it is what pauses the turn.

        ``tool`` is the tool's name or the tool object itself; ``input`` is JSON data or a
        pydantic model (sent as its JSON form). Without ``ref`` the runner names the call
        (``<tool>-1``, ...); refs are kept unique within the session either way.
        """
        if isinstance(input, BaseModel):
            input = input.model_dump(mode="json", by_alias=True)
        request = ToolRequest(name=_tool_name(tool), input=input)
        if ref is not None:  # unset rather than null: what is streamed has no ``"ref": null``
            request.ref = ref
        return cls.of_parts(Part(tool_request=request))

    @classmethod
    def of_parts(cls, *content: str | Part) -> ModelResponse:
        """A message of several parts, in order: each string is a text part, each
        :class:`Part` is kept (e.g. ``Part.of_request(...)`` to call tools in parallel)."""
        parts = [Part.of_text(item) if isinstance(item, str) else item for item in content]
        return cls(message=Message(role="model", content=parts))


#: Receives each streamed delta: the parts produced since the previous call.
ChunkSink = Callable[[list[Part]], Awaitable[None]]


@runtime_checkable
class Model(Protocol):
    """An LLM (or a stand-in for one)."""

    @property
    def name(self) -> str:
        """A short identifier, recorded on the turn (e.g. ``scripted`` or ``openai:gpt-4o``)."""
        ...

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """Answer ``request``; stream deltas to ``on_chunk`` while doing so, when given.

        Raise :class:`TransientModelError` for failures worth retrying (rate limits, timeouts,
        connection errors); any other exception fails the turn.
        """
        ...


class TransientModelError(TransientError):
    """A model failure worth retrying with backoff (rate limit, timeout, 5xx, lost connection)."""
