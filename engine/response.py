"""What a turn hands back: streamed chunks, paused interrupts and the final response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.conversation.parts import INTERRUPT, RESUMED, Message, Part, text_of
from engine.conversation.schemas import Schema, SchemaViolation, to_jsonable
from engine.conversation.session_state import Artifact, SessionData
from engine.errors import AgentError, TurnFailedError
from engine.status import FinishReason, TurnStatus
from engine.store import StoredSnapshot, TurnRecord

__all__ = [
    "AgentChunk",
    "AgentInterrupt",
    "AgentResponse",
    "ChunkEmitter",
    "failed_turn",
    "interrupts_of",
    "refused_response",
    "settled_response",
]


@dataclass(frozen=True)
class AgentChunk:
    """One streamed delta of a turn: Genkit's ``modelChunk``, or a session-state change
    (``customPatch``, ``artifact``).

    ``index`` is the position of the message being produced within this turn; it moves on
    whenever the role changes (model text, then the tool responses of a round, then the
    next model call...). A state chunk has no content: ``custom_patch`` holds RFC 6902
    operations on the custom state (the first of a turn replaces the whole value at path
    ``""``), ``artifact`` an artifact added or replaced.
    """

    role: str
    index: int
    content: list[Part]
    custom_patch: list[dict[str, Any]] | None = None
    artifact: dict[str, Any] | None = None

    @classmethod
    def of_state(cls, wire: Mapping[str, Any]) -> AgentChunk:
        """A ``{"customPatch": [...]}`` or ``{"artifact": {...}}`` chunk."""
        return cls(
            role="",
            index=0,
            content=[],
            custom_patch=list(wire["customPatch"]) if "customPatch" in wire else None,
            artifact=dict(wire["artifact"]) if "artifact" in wire else None,
        )

    @property
    def text(self) -> str:
        """The text of this delta."""
        return "".join(p.text for p in self.content if p.text is not None)

    @property
    def tool_requests(self) -> list[Part]:
        """The ``toolRequest`` parts of this delta."""
        return [p for p in self.content if p.tool_request is not None]

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> AgentChunk:
        """The inverse of :meth:`to_wire`."""
        if "modelChunk" not in wire:
            return cls.of_state(wire)
        body = wire["modelChunk"]
        return cls(
            role=str(body["role"]),
            index=int(body.get("index", 0)),
            content=[Part.model_validate(p) for p in body.get("content", [])],
        )

    def to_wire(self) -> dict[str, Any]:
        """``{"modelChunk": {role, index, content}}`` as Genkit streams it (or the state
        change's ``customPatch`` / ``artifact``)."""
        if self.custom_patch is not None:
            return {"customPatch": self.custom_patch}
        if self.artifact is not None:
            return {"artifact": self.artifact}
        return {
            "modelChunk": {
                "role": self.role,
                "index": self.index,
                "content": [p.to_wire() for p in self.content],
            }
        }


class AgentInterrupt:
    """A paused tool call waiting for an answer; ``respond``/``restart`` only build parts."""

    def __init__(self, part: Part, input_schema: Schema | None = None) -> None:
        request = part.tool_request
        if request is None:
            raise ValueError("An interrupt is built from a toolRequest part.")
        self.part = part
        self.name = request.name
        self.ref = request.ref
        self.raw_input = request.input
        #: What the tool asked with, validated into the interrupt's input schema when known.
        self.input: Any = request.input
        if input_schema is not None:
            try:
                self.input = input_schema.parse(request.input)
            except SchemaViolation:
                self.input = request.input
        #: The interrupt's metadata (``True`` for a plain interrupt).
        self.metadata: Any = (part.metadata or {}).get(INTERRUPT)

    def respond(self, output: Any) -> Part:
        """A ``toolResponse`` part answering this call with ``output`` (it sends nothing)."""
        return Part.of_response(self.name, self.ref, to_jsonable(output))

    def restart(self, *, resumed_metadata: Any = None) -> Part:
        """A ``toolRequest`` part re-running this call (it sends nothing).

        The tool sees ``ctx.resumed`` = ``resumed_metadata`` (``True`` when not given).
        """
        resumed = True if resumed_metadata is None else to_jsonable(resumed_metadata)
        return Part.of_request(self.name, self.ref, self.raw_input, {RESUMED: resumed})

    def __repr__(self) -> str:
        return f"AgentInterrupt(name={self.name!r}, ref={self.ref!r}, input={self.input!r})"


@dataclass
class AgentResponse:
    """The settled result of one ``send``/``resume``."""

    session_id: str
    snapshot_id: str | None
    status: TurnStatus
    finish_reason: FinishReason | None
    messages: list[Message]
    interrupts: list[AgentInterrupt] = field(default_factory=list)
    error: AgentError | None = None
    state: dict[str, Any] | None = None
    #: The session's custom state and artifacts as of the turn's last committed round.
    custom: Any = None
    artifacts: list[Artifact] = field(default_factory=list)
    #: The stored snapshot this response was made from, when it was read whole (a durable
    #: agent's settled turn): a chat continuing from it passes it on instead of reading it
    #: again (:attr:`engine.turns.request.TurnRequest.seen`). Not part of the wire form.
    stored: StoredSnapshot | None = field(default=None, repr=False, compare=False)

    @property
    def message(self) -> Message | None:
        """The last message of the conversation (the paused model message when interrupted)."""
        return self.messages[-1] if self.messages else None

    @property
    def text(self) -> str:
        """The text of :attr:`message`."""
        return text_of(self.message)

    def to_wire(self) -> dict[str, Any]:
        """Genkit's ``AgentOutput`` JSON."""
        wire: dict[str, Any] = {"sessionId": self.session_id}
        if self.snapshot_id is not None and self.state is None:
            wire["snapshotId"] = self.snapshot_id
        if self.state is not None:
            wire["state"] = self.state
        if self.message is not None:
            wire["message"] = self.message.to_wire()
        if self.artifacts:
            wire["artifacts"] = [a.to_wire() for a in self.artifacts]
        if self.finish_reason is not None:
            wire["finishReason"] = self.finish_reason.value
        if self.error is not None:
            wire["error"] = self.error.to_wire()
        return wire


def interrupts_of(message: Message | None, schemas: Mapping[str, Schema]) -> list[AgentInterrupt]:
    """The paused calls of a final message, as :class:`AgentInterrupt` objects."""
    if message is None or message.role != "model":
        return []
    return [
        AgentInterrupt(p, schemas.get(p.tool_request.name))
        for p in message.content
        if p.tool_request is not None and (p.metadata or {}).get(INTERRUPT)
    ]


def settled_response(
    turn: TurnRecord,
    messages: list[Message],
    schemas: Mapping[str, Schema],
    *,
    state: dict[str, Any] | None = None,
) -> AgentResponse:
    """The response for a settled turn holding ``messages``; raises
    :class:`TurnFailedError`, carrying that response, when the turn failed.

    ``state``: the signed blob of a client-managed session, which answers instead of a
    snapshot id."""
    response = AgentResponse(
        session_id=turn.session_id,
        snapshot_id=turn.id if state is None else None,
        status=turn.status,
        finish_reason=turn.finish_reason,
        messages=messages,
        interrupts=(
            interrupts_of(messages[-1] if messages else None, schemas)
            if turn.finish_reason is FinishReason.INTERRUPTED
            else []
        ),
        state=state,
        custom=turn.custom,
        artifacts=SessionData.of(None, turn.artifacts).artifacts,
    )
    if turn.status is TurnStatus.FAILED:
        error = turn.error
        raise failed_turn(
            response,
            error.message if error else "The turn failed.",
            status=error.status if error else "INTERNAL",
            details=error.details if error else None,
            snapshot_id=turn.id,
        )
    return response


def failed_turn(
    response: AgentResponse,
    message: str,
    *,
    status: str,
    details: Any,
    snapshot_id: str | None,
) -> TurnFailedError:
    """The :class:`TurnFailedError` of a turn that settled ``failed`` with ``response``,
    set as that response's ``error`` (each names the other, as for a refusal)."""
    failure = TurnFailedError(
        message, status=status, details=details, snapshot_id=snapshot_id, response=response
    )
    response.error = failure
    return failure


def refused_response(error: AgentError, *, session_id: str | None) -> AgentResponse:
    """The failed output Genkit answers a refused send or resume with (nothing was created:
    the caller's snapshot stays where it was), attached to ``error`` as its ``response``.
    Returns ``error``'s response."""
    response = AgentResponse(
        session_id=session_id or "",
        snapshot_id=error.snapshot_id,
        status=TurnStatus.FAILED,
        finish_reason=FinishReason.FAILED,
        messages=[],
        error=error,
    )
    error.response = response
    return response


class ChunkEmitter:
    """Numbers a turn's streamed chunks: ``index`` moves on whenever the role changes."""

    def __init__(self, sink: Callable[[AgentChunk], Awaitable[None]] | None) -> None:
        self._sink = sink
        self._role: str | None = None
        self._index = -1

    async def emit(self, role: str, content: list[Part]) -> None:
        if self._sink is None:
            return
        if role != self._role:
            self._role = role
            self._index += 1
        await self._sink(AgentChunk(role=role, index=self._index, content=content))

    async def emit_state(self, wire: Mapping[str, Any]) -> None:
        """Stream a session-state change (it does not move ``index``)."""
        if self._sink is not None:
            await self._sink(AgentChunk.of_state(wire))
