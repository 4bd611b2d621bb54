"""Starting a turn: find what it continues, validate the request against it, create the
pending turn.

Nothing is written when the request is refused: every check runs on the snapshot read before
the one write, and the store re-checks atomically what another caller could change meanwhile
(the session's latest turn, the interrupts still open).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from engine.client_state import client_turn_id, open_client_state
from engine.errors import (
    AgentError,
    InvalidArgumentError,
    NotFoundError,
    SessionBusyError,
    SnapshotNotResumableError,
)
from engine.executor import RetryPolicy
from engine.idempotency import created_already, keyed_turn_id, repeated_turn
from engine.ownership import check_own, visible
from engine.parts import Message
from engine.pinning import PinningAgent, pin_turn
from engine.resume import plan_continuation
from engine.session_state import SessionData
from engine.signing import StateSigner
from engine.status import ACTIVE_STATUSES
from engine.store import NewTurn, SessionStore, StoredSnapshot, TurnRecord
from engine.tools import Tool
from engine.tracing import capture_trace_context
from engine.turn_request import TurnRequest

__all__ = ["StartedTurn", "StartingAgent", "start_turn"]

logger = logging.getLogger("turnstile.agent")


class StartingAgent(PinningAgent, Protocol):
    """What starting a turn reads from the agent (declared here so this module needs no
    import of the agent)."""

    @property
    def store(self) -> SessionStore | None: ...

    @property
    def signer(self) -> StateSigner: ...

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def retry(self) -> RetryPolicy: ...

    @property
    def poll_interval(self) -> float: ...

    @property
    def lease_owner(self) -> str: ...


@dataclass
class StartedTurn:
    """A created (or, under an idempotency key, found) pending turn and its store."""

    store: SessionStore
    turn: TurnRecord
    #: Created by an earlier request with the same idempotency key, not by this one.
    repeated: bool = False


@dataclass
class _Base:
    """What a new turn continues: the store it lives in, the snapshot (``None``: a new
    session), the session id, and the snapshot's conversation and journal once read."""

    store: SessionStore
    turn: TurnRecord | None
    session_id: str
    stored: StoredSnapshot | None = None


async def start_turn(
    agent: StartingAgent,
    request: TurnRequest,
    *,
    listen: list[asyncio.Future[None]] | None = None,
) -> StartedTurn:
    """Validate ``request`` and create its pending turn.

    ``listen``: when given, a wait for the new turn's change notification is appended to it
    before the turn is created, so the caller's wait for the settle can miss nothing.
    """
    if request.idempotency_key is not None and agent.store is not None:
        request = replace(request, turn_id=request.turn_id or keyed_turn_id(agent.name, request))
        earlier = await repeated_turn(agent.store, request, agent=agent.name)
        if earlier is not None:
            return StartedTurn(store=agent.store, turn=earlier, repeated=True)
    base = await _base(agent, request)
    _check_settled(base, request)
    if base.turn is not None and base.stored is None:
        # A base found by session id or restored from client state: read what continuing
        # it needs. It was seen settled, so this sees everything its settle wrote.
        base.stored = await base.store.read_snapshot(base.turn.id)
        if base.stored is None:
            raise NotFoundError(f"Snapshot {base.turn.id} not found.")
    # Which definition the turn is pinned to; a resume across a definition change is
    # refused here, or adjusted by a registered migration, before anything is written.
    pinned = await pin_turn(
        agent,
        request.input,
        base.turn,
        base.stored.conversation if base.stored else [],
        base.store,
        client_managed=agent.store is None,
    )
    # Read with the snapshot at one moment: a snapshot seen settled comes with its last
    # round and journal rows (written by the settling transaction).
    answers, history_length = plan_continuation(
        pinned.input,
        base_id=base.turn.id if base.turn is not None else None,
        conversation=pinned.conversation,
        journal=base.stored.journal if base.stored else [],
        tools=agent.tools,
        decided_by=request.decided_by,
    )
    new = NewTurn(
        id=_new_turn_id(agent, request, base),
        session_id=base.session_id,
        agent=agent.name,
        parent_id=base.turn.id if base.turn is not None else None,
        input=pinned.input,
        history_length=history_length,
        initial_messages=_opening(request),
        max_attempts=agent.retry.max_attempts,
        owner=request.owner,
        trace_context=capture_trace_context(),
        # The session state the turn continues from: its base's last committed round's
        # (or, for a fork, its source's as of the copied round).
        custom=_opening_state(request, base).custom,
        artifacts=_opening_state(request, base).artifacts_wire() or None,
        app_version=pinned.pinning.app_version,
        definition_fingerprint=pinned.pinning.fingerprint,
        definition=dict(pinned.pinning.definition),
        note=pinned.note,
    )
    if listen is not None:
        # Wait for the turn's change notification from before it exists: nothing can be
        # missed, so wait_settled's first check needs no read.
        listen.append(
            asyncio.ensure_future(base.store.wait_for_change(new.id, agent.poll_interval))
        )
    try:
        turn = await base.store.create_turn(new, answers=answers)
    except AgentError as refused:
        # The creation may be this request's own: committed by an attempt whose answer
        # was lost (the store retried it and found it done), or by the first request
        # under the same idempotency key. Then it is a success, not a conflict.
        turn = await created_already(base.store, new, refused)
    logger.info(
        "turn %s (%s) created in session %r for agent %s",
        turn.id,
        request.input.kind,
        base.session_id,
        agent.name,
    )
    return StartedTurn(store=base.store, turn=turn)


async def _base(agent: StartingAgent, request: TurnRequest) -> _Base:
    """What ``request`` continues: a client's state blob, a snapshot named by id (read
    with its conversation and journal, one round trip on PostgreSQL), a session's latest
    turn, or nothing (a new session)."""
    store = agent.store
    if store is None:
        opened = await open_client_state(
            request.state,
            signer=agent.signer,
            agent=agent.name,
            lease_owner=agent.lease_owner,
            session_owner=request.owner,
        )
        return _Base(opened.store, opened.base, opened.session_id)
    if request.snapshot_id is not None:
        # One read for the snapshot and what continuing it needs: a resume reads nothing
        # else before it is queued.
        stored = await store.read_snapshot(request.snapshot_id)
        turn = await check_own(
            store,
            request.snapshot_id,
            stored.turn if stored else None,
            agent=agent.name,
            owner=request.owner,
        )
        if request.session_id is not None and request.session_id != turn.session_id:
            raise InvalidArgumentError(
                f"Snapshot {turn.id} does not belong to session {request.session_id} "
                f"(it belongs to {turn.session_id})."
            )
        return _Base(store, turn, turn.session_id, stored)
    if request.session_id is not None:
        latest = await store.latest_turn(request.session_id)
        if latest is not None and not await visible(
            store, latest, agent=agent.name, owner=request.owner
        ):
            raise NotFoundError(
                f"Session '{request.session_id}' not found for agent '{agent.name}'."
            )
        return _Base(store, latest, request.session_id)
    return _Base(store, None, str(uuid.uuid4()))


def _check_settled(base: _Base, request: TurnRequest) -> None:
    """Refuse to continue a turn that is still running: the session holds one at a time."""
    turn = base.turn
    if turn is None or turn.status not in ACTIVE_STATUSES:
        return
    if request.snapshot_id is None:
        # Named by session: its latest turn is still running, a conflict to retry.
        raise SessionBusyError(
            f"Session {base.session_id} already has a running turn ({turn.id}, "
            f"{turn.status.value}); wait for it to settle or abort it.",
            snapshot_id=turn.id,
        )
    raise SnapshotNotResumableError(
        f"Snapshot {turn.id} is still {turn.status.value}: wait for it to settle or "
        "abort it before continuing the session.",
        snapshot_id=turn.id,
    )


def _opening_state(request: TurnRequest, base: _Base) -> SessionData:
    if request.opening_state is not None:
        return request.opening_state
    if base.stored is None:
        return SessionData()
    return SessionData.of(base.stored.turn.custom, base.stored.turn.artifacts)


def _opening(request: TurnRequest) -> list[Message]:
    """The new turn's round 0: the caller's opening messages (a fork), else the message."""
    if request.opening is not None:
        return list(request.opening)
    return [request.input.message] if request.input.message is not None else []


def _new_turn_id(agent: StartingAgent, request: TurnRequest, base: _Base) -> str:
    """The caller's id for the turn if it chose one; replay-stable for client state."""
    if agent.store is None and base.turn is not None:
        return client_turn_id(base.turn.id, request.input)
    return request.turn_id or str(uuid.uuid4())
