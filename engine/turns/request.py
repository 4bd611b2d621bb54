"""What a caller asks of an agent for one turn, shared by every way a turn is requested.

A module of its own so that the chat, the inbox, expiry and the HTTP server can build a
request without importing the agent that serves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.conversation.parts import Message
from engine.conversation.session_state import SessionData
from engine.store import StoredSnapshot, TurnInput

__all__ = ["TurnRequest"]


@dataclass(frozen=True)
class TurnRequest:
    """Where a turn continues from, and with what."""

    input: TurnInput
    session_id: str | None = None
    snapshot_id: str | None = None
    state: Mapping[str, Any] | None = None
    #: Who answers the interrupts of a resume (recorded on the journal rows).
    decided_by: str | None = None
    #: The principal the session belongs to (``None``: trusted local caller, no check). A
    #: new session is created for it; another principal's session is reported unknown.
    owner: str | None = None
    #: The new turn's id, chosen by the caller (e.g. to subscribe to its chunks first).
    turn_id: str | None = None
    #: The caller's key for this request: the same key again (a retry after a timeout or a
    #: lost answer) returns the turn the first request created instead of creating another.
    idempotency_key: str | None = None
    #: The messages the new turn opens with (its round 0) instead of the input's message: a
    #: fork's copy of another turn's conversation (:mod:`engine.fork`).
    opening: tuple[Message, ...] | None = None
    #: The session state a fork opens with: its source's as of the round it copies.
    opening_state: SessionData | None = None
    #: The snapshot ``snapshot_id`` names, as the caller read it settled (a chat's previous
    #: answer): not read again. What could have changed since (a decision recorded on its
    #: journal, another turn joining the session) the creating statement checks anyway.
    seen: StoredSnapshot | None = None
