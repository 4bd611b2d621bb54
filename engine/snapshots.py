"""Snapshots as callers see them, and the user-message shapes a send accepts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from engine.errors import InvalidArgumentError
from engine.parts import Message, Part
from engine.status import FinishReason, TurnStatus

__all__ = ["SessionSnapshot", "SessionState", "coerce_message"]


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
