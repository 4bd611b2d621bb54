"""Starting a turn: find what it continues, validate the request against it, create the
pending turn.

A request says what it continues in one of three ways (docs/decisions.md, "What a send
continues"):

- a **session** (``session_id`` alone): its latest turn, whatever it is;
- **where the caller is** (``snapshot_id`` and ``session_id``): the snapshot, which must
  still be the session's latest — a compare-and-set, so a send that raced another is
  refused rather than dropping the other's message;
- **exactly a snapshot** (``snapshot_id`` alone, Genkit's meaning): the session's latest
  is appended to; a snapshot the session's only later turns failed or were aborted after is
  appended to as well (those turns are left behind, as Genkit's last-good snapshot leaves
  them); any other snapshot, given a new message, is **branched**: a new session opens with
  a copy of its conversation, so the original session is left exactly as it was.

Nothing is written when the request is refused: every check runs on the snapshot read before
the one write, and the store re-checks atomically what another caller could change meanwhile
(the session's latest turn, the interrupts still open).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from engine.conversation.parts import Message
from engine.conversation.session_state import SessionData
from engine.errors import (
    AgentError,
    NotFoundError,
    SessionBusyError,
    SessionMismatchError,
    SnapshotNotResumableError,
    StaleSnapshotError,
)
from engine.ids import new_id
from engine.state.client_state import client_turn_id, open_client_state
from engine.state.pinning import PinningAgent, pin_turn
from engine.state.signing import StateSigner
from engine.status import ACTIVE_STATUSES, TurnStatus
from engine.store import (
    ClaimedTurn,
    InterruptAnswer,
    NewTurn,
    SessionStore,
    StoredSnapshot,
    TurnRecord,
)
from engine.telemetry.tracing import capture_trace_context
from engine.tools import Tool
from engine.turns.executor import RetryPolicy
from engine.turns.handover import SlotReservation
from engine.turns.idempotency import created_already, keyed_turn_id, repeated_turn
from engine.turns.ownership import check_own, visible
from engine.turns.request import TurnRequest
from engine.turns.resume import plan_continuation

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

    async def reserve_slot(
        self, store: SessionStore, app_version: str | None
    ) -> SlotReservation | None: ...


@dataclass
class StartedTurn:
    """A created (or, under an idempotency key, found) pending turn and its store."""

    store: SessionStore
    turn: TurnRecord
    #: Created by an earlier request with the same idempotency key, not by this one.
    repeated: bool = False
    #: The turn as its creation leased it, with its progress, when it was created leased
    #: to whoever runs it (engine/turns/handover.py).
    claimed: ClaimedTurn | None = None


@dataclass
class _Base:
    """What a new turn continues: the store it lives in, the snapshot (``None``: a new
    session), the session id, and the snapshot's conversation and journal once read."""

    store: SessionStore
    turn: TurnRecord | None
    session_id: str
    stored: StoredSnapshot | None = None
    #: The session's latest turn the new turn expects (:attr:`NewTurn.expected_latest_id`);
    #: ``turn``'s id unless said otherwise.
    expected_latest_id: str | None = None
    #: The new turn opens a new session (``session_id``) as a branch of ``turn``.
    branch: bool = False
    #: The principal a branch's new session belongs to (its source session's).
    branch_owner: str | None = None

    def __post_init__(self) -> None:
        if self.expected_latest_id is None and not self.branch and self.turn is not None:
            self.expected_latest_id = self.turn.id


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
    if not _exact_message(agent, request):
        return await _create(agent, request, await _base(agent, request), listen)
    # Continuing exactly a snapshot with a message always succeeds, as an append or as a
    # branch: when another send moved the session on between the read and the write (its
    # turn may still be running), the request is planned again against the session as it
    # is now, and then branches.
    request = replace(request, turn_id=request.turn_id or new_id())
    attempts_left = _EXACT_ATTEMPTS
    while True:
        try:
            return await _create(agent, request, await _base(agent, request), listen)
        except (StaleSnapshotError, SessionBusyError):
            attempts_left -= 1
            if not attempts_left:
                raise


#: How often continuing exactly a snapshot is planned before a moving session's refusal
#: stands (each refusal means another send won the session's head meanwhile).
_EXACT_ATTEMPTS = 3


def _exact_message(agent: StartingAgent, request: TurnRequest) -> bool:
    """Whether ``request`` continues exactly a snapshot (named without its session) with a
    new message: the one request that branches rather than being refused as stale."""
    return (
        agent.store is not None
        and request.snapshot_id is not None
        and request.session_id is None
        and request.input.kind == "message"
    )


async def _create(
    agent: StartingAgent,
    request: TurnRequest,
    base: _Base,
    listen: list[asyncio.Future[None]] | None,
) -> StartedTurn:
    """Validate ``request`` against ``base`` and create its pending turn."""
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
    opening = _opening(request)
    if base.branch:
        # The branch keeps a copy of the conversation it continues, as a fork does: its
        # session never reads the source session's rows, so pruning one leaves the other
        # whole.
        opening = [m.copy_deep() for m in pinned.conversation] + opening
        history_length = 0
    new = NewTurn(
        id=_new_turn_id(agent, request, base),
        session_id=base.session_id,
        agent=agent.name,
        parent_id=base.turn.id if base.turn is not None else None,
        expected_latest_id=base.expected_latest_id,
        input=pinned.input,
        history_length=history_length,
        initial_messages=opening,
        max_attempts=agent.retry.max_attempts,
        owner=request.owner or base.branch_owner,
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
    if listen is not None and not listen:
        # Wait for the turn's change notification from before it exists: nothing can be
        # missed, so wait_settled's first check needs no read.
        listen.append(
            asyncio.ensure_future(base.store.wait_for_change(new.id, agent.poll_interval))
        )
    claimed = None
    try:
        turn, claimed = await _created(
            base.store, new, answers, await agent.reserve_slot(base.store, new.app_version)
        )
    except AgentError as refused:
        # The creation may be this request's own: committed by an attempt whose answer
        # was lost (the store retried it and found it done), or by the first request
        # under the same idempotency key. Then it is a success, not a conflict. (A turn
        # created leased to a slot of ours whose answer was lost runs once its lease
        # expires, like a turn of a worker that died.)
        turn = await created_already(base.store, new, refused)
    logger.info(
        "turn %s (%s) created in session %r for agent %s%s",
        turn.id,
        request.input.kind,
        base.session_id,
        agent.name,
        f", a branch of snapshot {turn.parent_id}" if base.branch else "",
    )
    return StartedTurn(store=base.store, turn=turn, claimed=claimed)


async def _created(
    store: SessionStore,
    new: NewTurn,
    answers: list[InterruptAnswer],
    slot: SlotReservation | None,
) -> tuple[TurnRecord, ClaimedTurn | None]:
    """Create the turn: for the queue, or, given who runs it (``slot``), leased to them and
    handed over at once (engine/turns/handover.py); the turn, and its claim if leased."""
    if slot is None:
        return await store.create_turn(new, answers=answers), None
    try:
        claimed = await store.create_claimed_turn(
            new, answers=answers, owner=slot.owner, lease_seconds=slot.lease_seconds
        )
    except BaseException:
        slot.release()
        raise
    slot.run(claimed)
    return claimed.turn, claimed


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
        # One read for the snapshot and what continuing it needs (none when the caller
        # brings it, as it read it settled): a resume reads nothing else before it is queued.
        seen = request.seen
        stored = (
            seen
            if seen is not None and seen.turn.id == request.snapshot_id
            else await store.read_snapshot(request.snapshot_id)
        )
        turn = await check_own(
            store,
            request.snapshot_id,
            stored.turn if stored else None,
            agent=agent.name,
            owner=request.owner,
        )
        if request.session_id is None:
            return await _exactly(store, turn, stored, request)
        if request.session_id != turn.session_id:
            raise SessionMismatchError(
                f"Snapshot {turn.id} does not belong to session {request.session_id} "
                f"(it belongs to {turn.session_id})."
            )
        # Where the caller is: the store refuses it unless it is still the latest.
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
    return _Base(store, None, new_id())


async def _exactly(
    store: SessionStore,
    turn: TurnRecord,
    stored: StoredSnapshot | None,
    request: TurnRequest,
) -> _Base:
    """What continuing exactly ``turn`` means (a snapshot named without its session): an
    append when it is the session's latest, or when only failed or aborted turns followed
    it; otherwise, for a new message, a branch into a new session. Anything else (a retry,
    a resume) is left to the store, which refuses a snapshot that is not the latest."""
    latest = await store.latest_turn(turn.session_id)
    if latest is None or latest.id == turn.id:
        return _Base(store, turn, turn.session_id, stored)
    if await _left_behind(store, latest, turn):
        return _Base(store, turn, turn.session_id, stored, expected_latest_id=latest.id)
    if request.input.kind != "message":
        return _Base(store, turn, turn.session_id, stored)
    session = await store.get_session(turn.session_id)
    return _Base(
        store,
        turn,
        new_id(),
        stored,
        branch=True,
        branch_owner=session.owner if session is not None else None,
    )


async def _left_behind(store: SessionStore, latest: TurnRecord, turn: TurnRecord) -> bool:
    """Whether every turn of the session after ``turn`` — the chain from ``latest`` back to
    it — failed or was aborted: a tail a caller continuing from ``turn`` leaves behind."""
    current: TurnRecord | None = latest
    while current is not None and current.status in _LEFT_BEHIND:
        if current.parent_id == turn.id:
            return True
        if current.parent_id is None:
            return False
        current = await store.get_turn(current.parent_id)
        if current is not None and current.session_id != turn.session_id:
            return False
    return False


#: The settled statuses of turns whose conversation a caller may leave behind by continuing
#: from before them.
_LEFT_BEHIND = frozenset({TurnStatus.FAILED, TurnStatus.ABORTED})


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
    return request.turn_id or new_id()
