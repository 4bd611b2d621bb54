"""Messages and parts, shaped exactly as Genkit's on the wire (camelCase JSON).

A :class:`Part` holds one payload key (``text``, ``toolRequest``, ``toolResponse``, ...) plus
optional ``metadata``. Serialisation keeps every key that was set, including explicit
``null`` values: a tool that returned ``None`` must round-trip as ``"output": null`` (Genkit's
falsy-``pendingOutput`` bug is avoided by testing key presence, never truthiness).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "INTERRUPT",
    "MALFORMED_INPUT",
    "PENDING_OUTPUT",
    "REJECTED",
    "RESOLVED_INTERRUPT",
    "RESUMED",
    "SOURCE",
    "TOOL_ERROR",
    "Message",
    "Part",
    "Role",
    "ToolRequest",
    "ToolResponse",
    "paused_calls",
    "text_of",
    "tool_requests_of",
]

Role = Literal["system", "user", "model", "tool"]

# Metadata keys Genkit uses for interrupts (camelCase on the wire and in Python dicts).
INTERRUPT = "interrupt"
PENDING_OUTPUT = "pendingOutput"
RESOLVED_INTERRUPT = "resolvedInterrupt"
RESUMED = "resumed"
SOURCE = "source"

# Turnstile's own metadata keys for tool calls a model got wrong (issue 5). A model adapter
# marks a toolRequest whose arguments were not JSON with MALFORMED_INPUT (the parse error; the
# raw text is kept as the input), and the runner answers any malformed call with a
# toolResponse marked TOOL_ERROR whose output is ``{"error": message}``, so the model can
# correct itself instead of the turn failing.
MALFORMED_INPUT = "malformedInput"
TOOL_ERROR = "toolError"

# Turnstile's mark on a toolResponse that answers a call an approver rejected (issue 32):
# ``{"reason", "by", "at"}``. Its output is a refusal, not the tool's output (Genkit has no
# reject; this extends it through an ordinary tool response).
REJECTED = "rejected"


class _Wire(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=False
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON object Genkit expects: camelCase keys, only the keys that were set."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class ToolRequest(_Wire):
    """A model's request to call a tool: ``{name, ref?, input?}``."""

    name: str
    ref: str | None = None
    input: Any = None


class ToolResponse(_Wire):
    """A tool's answer to a request: ``{name, ref?, output?}``."""

    name: str
    ref: str | None = None
    output: Any = None


class Part(_Wire):
    """One piece of a message. Exactly one payload key is expected to be set."""

    text: str | None = None
    reasoning: str | None = None
    media: dict[str, Any] | None = None
    data: Any = None
    tool_request: ToolRequest | None = None
    tool_response: ToolResponse | None = None
    metadata: dict[str, Any] | None = None
    custom: dict[str, Any] | None = None

    @classmethod
    def of_text(cls, text: str) -> Part:
        """A text part."""
        return cls(text=text)

    @classmethod
    def of_request(
        cls, name: str, ref: str | None, input: Any, metadata: dict[str, Any] | None = None
    ) -> Part:
        """A ``toolRequest`` part (``metadata`` only set when given)."""
        return cls._carrying(metadata, tool_request=ToolRequest(name=name, ref=ref, input=input))

    @classmethod
    def of_response(
        cls, name: str, ref: str | None, output: Any, metadata: dict[str, Any] | None = None
    ) -> Part:
        """A ``toolResponse`` part (``metadata`` only set when given)."""
        return cls._carrying(
            metadata, tool_response=ToolResponse(name=name, ref=ref, output=output)
        )

    @classmethod
    def _carrying(cls, metadata: dict[str, Any] | None, **payload: Any) -> Part:
        part = cls(**payload)
        # Set only when given: an unset key stays off the wire, a set ``None`` would not.
        if metadata is not None:
            part.metadata = metadata
        return part

    def copy_deep(self) -> Part:
        """An independent copy (through the wire form, as :meth:`Message.copy_deep`)."""
        return Part.model_validate(self.to_wire())

    def meta(self) -> dict[str, Any]:
        """The metadata dict (empty when unset); a copy, safe to modify."""
        return dict(self.metadata or {})


class Message(_Wire):
    """``{role, content: Part[], metadata?}``."""

    role: Role
    content: list[Part] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None

    @classmethod
    def user(cls, text: str) -> Message:
        """A user message holding one text part."""
        return cls(role="user", content=[Part.of_text(text)])

    @property
    def text(self) -> str:
        """The concatenated text parts."""
        return text_of(self)

    @property
    def tool_requests(self) -> list[Part]:
        """The ``toolRequest`` parts, in order."""
        return tool_requests_of(self)

    def copy_deep(self) -> Message:
        """An independent copy (stores hand out copies so callers cannot mutate history)."""
        return Message.model_validate(self.to_wire())


def text_of(message: Message | None) -> str:
    """Concatenate the text parts of ``message`` ('' for ``None``)."""
    if message is None:
        return ""
    return "".join(p.text for p in message.content if p.text is not None)


def tool_requests_of(message: Message | None) -> list[Part]:
    """The ``toolRequest`` parts of ``message``."""
    if message is None:
        return []
    return [p for p in message.content if p.tool_request is not None]


def paused_calls(message: Message | None) -> list[Part]:
    """The ``toolRequest`` parts of ``message`` that carry ``interrupt`` metadata."""
    if message is None or message.role != "model":
        return []
    return [
        p
        for p in message.content
        if p.tool_request is not None and p.metadata is not None and p.metadata.get(INTERRUPT)
    ]
