"""Snapshots as callers see them, the user-message shapes a send accepts, and the rebuild of
a snapshot from a client-managed state blob."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, Field

from engine.conversation.parts import Message, Part, paused_calls
from engine.conversation.session_state import SessionData
from engine.errors import InvalidArgumentError
from engine.status import FinishReason, TurnStatus
from engine.store import (
    NewTurn,
    SessionStore,
    ToolCallRecord,
    ToolCallStatus,
    Transition,
    TurnInput,
    TurnRecord,
)

__all__ = [
    "SessionSnapshot",
    "SessionState",
    "coerce_message",
    "coerce_part",
    "restore_client_state",
]


class BlobPinning(Protocol):
    """What a client-managed blob is pinned to (:class:`engine.state.client_state.BlobPin`,
    declared here because that module imports this one)."""

    @property
    def app_version(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def definition(self) -> dict[str, Any] | None: ...


class SessionState(BaseModel):
    """Genkit's ``SessionState``: the conversation a snapshot holds."""

    session_id: str
    messages: list[Message] = Field(default_factory=list)
    custom: Any = None
    artifacts: list[Any] = Field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        """``{sessionId, messages, custom?, artifacts}``."""
        wire: dict[str, Any] = {
            "sessionId": self.session_id,
            "messages": [m.to_wire() for m in self.messages],
            "artifacts": list(self.artifacts),
        }
        if self.custom is not None:
            wire["custom"] = self.custom
        return wire


class SessionSnapshot(BaseModel):
    """One turn as a snapshot: status, finish reason, error and the conversation it holds."""

    snapshot_id: str
    session_id: str
    parent_id: str | None
    created_at: datetime
    updated_at: datetime
    status: TurnStatus
    finish_reason: FinishReason | None = None
    error: dict[str, Any] | None = None
    state: SessionState

    @classmethod
    def of(cls, turn: TurnRecord, messages: list[Message]) -> SessionSnapshot:
        """The snapshot of ``turn``, whose conversation is ``messages``."""
        return cls(
            snapshot_id=turn.id,
            session_id=turn.session_id,
            parent_id=turn.parent_id,
            created_at=turn.created_at,
            updated_at=turn.updated_at,
            status=turn.status,
            finish_reason=turn.finish_reason,
            error=turn.error.model_dump(exclude_none=True) if turn.error else None,
            state=SessionState(
                session_id=turn.session_id,
                messages=messages,
                custom=turn.custom,
                artifacts=SessionData.of(None, turn.artifacts).artifacts_wire(),
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        """Genkit's ``SessionSnapshot`` JSON."""
        wire: dict[str, Any] = {
            "snapshotId": self.snapshot_id,
            "sessionId": self.session_id,
            "createdAt": self.created_at.isoformat(),
            "updatedAt": self.updated_at.isoformat(),
            "status": self.status.value,
            "state": self.state.to_wire(),
        }
        if self.parent_id is not None:
            wire["parentId"] = self.parent_id
        if self.finish_reason is not None:
            wire["finishReason"] = self.finish_reason.value
        if self.error is not None:
            wire["error"] = self.error
        return wire


def coerce_message(
    message: str | Message | Sequence[Part] | Mapping[str, Any] | None,
) -> Message | None:
    """Accept the shapes callers naturally pass as a user message."""
    if message is None:
        return None
    if isinstance(message, str):
        return Message.user(message)
    if isinstance(message, Message):
        if message.role != "user":
            raise InvalidArgumentError(
                f"A sent message must have role 'user', not '{message.role}'."
            )
        return message
    if isinstance(message, Mapping):
        try:
            parsed = Message.model_validate(dict(message))
        except ValueError as exc:
            raise InvalidArgumentError(f"Malformed message: {exc}") from exc
        return coerce_message(parsed)
    parts = [p if isinstance(p, Part) else Part.model_validate(p) for p in message]
    return Message(role="user", content=parts)


def coerce_part(value: Part | Mapping[str, Any]) -> Part:
    """A part a caller passes (a resume's answer): a :class:`Part`, or its wire mapping."""
    return value if isinstance(value, Part) else Part.model_validate(dict(value))


async def restore_client_state(
    scratch: SessionStore,
    state: Mapping[str, Any],
    signature: str,
    *,
    agent: str,
    owner: str,
    session_owner: str | None = None,
    pin: BlobPinning | None = None,
) -> TurnRecord:
    """Rebuild the settled snapshot a verified client-managed state blob describes, in a
    scratch store, so a client-managed turn runs on the same runner as a stored one.

    ``owner`` leases the rebuilt turn; ``session_owner`` is the principal continuing it,
    whose session the scratch one is (the blob itself is the client's to hold). ``pin``,
    the blob's, is recorded on the rebuilt turn, as a stored turn records its own."""
    try:
        messages = [Message.model_validate(m) for m in state.get("messages") or []]
    except ValueError as exc:
        raise InvalidArgumentError(f"Client state holds a malformed message: {exc}") from exc
    data = SessionData.of(state.get("custom"), state.get("artifacts"))
    # Derived from the signature, so replaying one blob yields the same idempotency keys.
    digest = hashlib.sha256(signature.encode()).hexdigest()[:24]
    turn_id = f"client-{digest}"
    await scratch.create_turn(
        NewTurn(
            id=turn_id,
            session_id=str(state["sessionId"]),
            agent=agent,
            input=TurnInput(kind="restore"),
            initial_messages=messages,
            owner=session_owner,
            custom=data.custom,
            artifacts=data.artifacts_wire() or None,
            app_version=pin.app_version if pin is not None else None,
            definition_fingerprint=pin.fingerprint if pin is not None else None,
            definition=pin.definition if pin is not None else None,
        )
    )
    claimed = (await scratch.claim_turn(turn_id, owner=owner, lease_seconds=60)).turn
    paused = paused_calls(messages[-1] if messages else None)
    for part in paused:
        assert part.tool_request is not None
        ref = str(part.tool_request.ref)
        await scratch.record_call(
            turn_id,
            lease_token=claimed.lease_token,
            call=ToolCallRecord(
                turn_id=turn_id,
                round=0,
                ref=ref,
                name=part.tool_request.name,
                input=part.tool_request.input,
                status=ToolCallStatus.INTERRUPTED,
                interrupt=(part.metadata or {}).get("interrupt"),
                idempotency_key=f"{turn_id}:{ref}",
            ),
        )
    return await scratch.transition(
        turn_id,
        Transition(
            expected={TurnStatus.PENDING},
            new=TurnStatus.COMPLETED,
            lease_token=claimed.lease_token,
            finish_reason=FinishReason.INTERRUPTED if paused else FinishReason.STOP,
        ),
    )
