"""The model protocol the turn runner calls.

A model is asynchronous and streams: it receives a :class:`ModelRequest` (the agent's system
message first, then the conversation, plus the tools it may call) and an optional chunk sink,
pushes content deltas into the sink as it produces them, and returns the complete
:class:`ModelResponse`. Adapters for real providers (OpenAI, Anthropic) implement the same
protocol; :class:`~engine.scripted.ScriptedModel` is the offline, deterministic one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import BaseModel, BeforeValidator, Field

from engine.conversation.parts import Message, Part
from engine.errors import TransientError
from engine.status import FinishReason

__all__ = [
    "ChunkSink",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelUsage",
    "ToolSpec",
    "TransientModelError",
]


class ToolSpec(BaseModel):
    """What a model is told about one tool (interrupts are offered as ordinary tools)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None


class ModelRequest(BaseModel):
    """One model call: ``messages`` start with the system message when the agent has one."""

    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)


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
