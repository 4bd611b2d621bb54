"""Idempotent requests: one turn per idempotency key, and reading back a creation whose
answer was lost.

A caller that retries after a timeout must get the turn its first attempt created, not a
second one; both the key and the lost-answer read-back rest on a turn id chosen before the
creation is sent.
"""

from __future__ import annotations

import hashlib
import logging

from engine.errors import AgentError, InvalidArgumentError, StoreError
from engine.store import NewTurn, SessionStore, TurnInput, TurnRecord
from engine.turns.ownership import owned_by
from engine.turns.request import TurnRequest

__all__ = ["created_already", "keyed_turn_id", "repeated_turn", "same_input"]

logger = logging.getLogger("turnstile.agent")


def keyed_turn_id(agent: str, request: TurnRequest) -> str:
    """The turn id of a request under an idempotency key: one per agent and principal."""
    assert request.idempotency_key is not None
    scope = f"{agent}\x00{request.owner or ''}\x00{request.idempotency_key}"
    return "key-" + hashlib.sha256(scope.encode()).hexdigest()[:32]


async def repeated_turn(
    store: SessionStore, request: TurnRequest, *, agent: str
) -> TurnRecord | None:
    """The turn an earlier request with ``request``'s idempotency key created (``None``:
    none yet); a different request under the same key is refused."""
    assert request.turn_id is not None
    earlier = await store.get_turn(request.turn_id)
    if earlier is None:
        return None
    same = (
        earlier.agent == agent
        and request.session_id in (None, earlier.session_id)
        and request.snapshot_id in (None, earlier.parent_id)
        and same_input(earlier.input, request.input)
        and await owned_by(store, earlier.session_id, request.owner)
    )
    if not same:
        raise InvalidArgumentError(
            f"Idempotency key {request.idempotency_key!r} was already used for a different "
            "request; use a new key for a new request."
        )
    logger.info("turn %s: repeated request (same idempotency key)", earlier.id)
    return earlier


async def created_already(store: SessionStore, new: NewTurn, refused: AgentError) -> TurnRecord:
    """``new`` as the store holds it, if the refused creation had in fact happened (the
    same turn: id, session, parent and input); else ``refused`` is raised."""
    try:
        existing = await store.get_turn(new.id)
    except StoreError:
        raise refused from None
    if (
        existing is None
        or existing.session_id != new.session_id
        or existing.parent_id != new.parent_id
        or not same_input(existing.input, new.input)
    ):
        if isinstance(refused, StoreError) and refused.may_have_applied:
            # Read back: the turn does not exist, so the write did not apply.
            raise StoreError(refused.message, may_have_applied=False) from refused
        raise refused
    logger.info("turn %s: created by an earlier attempt of this request", new.id)
    return existing


def same_input(stored: TurnInput, requested: TurnInput) -> bool:
    """Whether two turn inputs ask for the same thing (streaming or not is no difference)."""
    return stored.model_dump(mode="json", exclude={"relay"}) == requested.model_dump(
        mode="json", exclude={"relay"}
    )
