"""The rules every store applies, written once so the stores cannot drift apart.

A store decides *how* to persist (a dict in memory, a guarded UPDATE in SQL); *what* a
transition checks and changes, which answers are acceptable, where an abort leads, what an
assignment change does and which edit the votes stand on are defined here and used by both
:mod:`engine.store.memory` and :mod:`stores`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from engine.conversation.schemas import canonical_json
from engine.errors import (
    ApprovalNotPendingError,
    DecisionConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    SessionBusyError,
    StaleSnapshotError,
    StaleTransitionError,
)
from engine.status import ACTIVE_STATUSES, FinishReason, TurnStatus, can_transition
from engine.store.port import SessionStore
from engine.store.records import (
    Assignment,
    AssignmentChange,
    FollowOnClaim,
    InterruptAnswer,
    NewTurn,
    SessionRecord,
    ToolCallRecord,
    ToolCallStatus,
    Transition,
    TurnRecord,
    WebhookSettlement,
)

__all__ = [
    "ABANDONED_ABORT",
    "CreationRefused",
    "LeaseHolder",
    "LeaseState",
    "abort_target",
    "apply_change",
    "check_answerable",
    "check_answers",
    "check_creation",
    "check_lease",
    "check_not_busy",
    "check_parent",
    "check_recorded",
    "check_session",
    "check_transition",
    "claim_after",
    "same_answer",
    "settled_fields",
    "transition_changes",
]

#: How a claim settles an ``aborting`` turn whose lease expired (its worker died).
ABANDONED_ABORT = Transition(
    expected=frozenset({TurnStatus.ABORTING}),
    new=TurnStatus.ABORTED,
    lease_token=None,
    finish_reason=FinishReason.ABORTED,
    note="settled by a claim: its worker stopped while aborting",
)


def check_session(session: SessionRecord, turn: NewTurn) -> None:
    """A new turn joins a session of its own agent and, when it names an owner, of that
    owner (another principal's session is reported as unknown, not as forbidden)."""
    if session.agent != turn.agent:
        raise InvalidArgumentError(
            f"Session {turn.session_id} belongs to agent '{session.agent}', not '{turn.agent}'."
        )
    if turn.owner is not None and session.owner != turn.owner:
        raise NotFoundError(f"Session '{turn.session_id}' not found for agent '{turn.agent}'.")


def check_parent(turn: NewTurn, latest_id: str | None) -> None:
    """A new turn is created only while its session's latest turn is the one the request
    was checked against (:attr:`NewTurn.expected_latest_id`; a first turn: an empty session).

    Checked where the turn is created, under the session's lock: two sends that both read
    the same latest snapshot cannot both continue it, so no message is left off the
    conversation by a turn that continued a stale parent.
    """
    expected = turn.expected_latest_id
    if expected == latest_id:
        return
    if expected is None:
        detail = f"it already has turns (latest: {latest_id})"
    else:
        detail = f"snapshot {expected} is no longer its latest ({latest_id} is)"
    raise StaleSnapshotError(
        f"Session {turn.session_id} moved on: {detail}. Continue from the latest snapshot.",
        snapshot_id=latest_id,
    )


def check_answerable(call: ToolCallRecord | None, answer: InterruptAnswer) -> str | None:
    """Raise unless ``answer`` may close ``call``: it must be ``interrupted`` and, if an
    approver recorded a decision on it, answered the same way. Returns who decided it: the
    recorded approver when there is one, else the answer's."""
    if call is None or call.status is not ToolCallStatus.INTERRUPTED:
        state = "unknown" if call is None else call.status.value
        raise ApprovalNotPendingError(
            f"Interrupt '{answer.ref}' of snapshot {answer.turn_id} is not pending "
            f"(it is {state}); it may have been answered already."
        )
    check_recorded(call, answer.answer, answer.turn_id)
    return call.decided_by if call.decided_at is not None else answer.decided_by


def check_answers(turn: NewTurn, answers: Sequence[InterruptAnswer]) -> None:
    """Answers must decide calls of the new turn's parent, each call once."""
    keys = [(a.turn_id, a.round, a.ref) for a in answers]
    if len(set(keys)) != len(keys):
        raise InvalidArgumentError("The same interrupt is answered twice.")
    for answer in answers:
        if answer.turn_id != turn.parent_id:
            raise InvalidArgumentError(
                f"Answers must decide interrupts of the parent snapshot {turn.parent_id}, "
                f"not of {answer.turn_id}."
            )


class LeaseHolder(Protocol):
    """What the lease checks read of a turn: a :class:`TurnRecord`, or the two columns a
    store's refused statement reports."""

    @property
    def status(self) -> TurnStatus: ...

    @property
    def lease_token(self) -> int: ...


@dataclass(frozen=True)
class LeaseState:
    """A turn's status and lease token, as a store's statement read them."""

    status: TurnStatus
    lease_token: int


Held = TypeVar("Held", bound=LeaseHolder)


def check_lease(turn_id: str, lease_token: int, current: LeaseHolder | None) -> None:
    """Raise unless ``lease_token`` still holds ``current``, a running turn (the fence every
    journal write passes)."""
    if current is None:
        raise StaleTransitionError(turn_id, f"Turn {turn_id} does not exist.")
    if current.lease_token != lease_token or current.status not in ACTIVE_STATUSES:
        raise LeaseLostError(
            turn_id,
            f"Lease {lease_token} on turn {turn_id} is no longer valid "
            f"(token {current.lease_token}, status {current.status.value}).",
        )


def check_transition(current: Held | None, turn_id: str, change: Transition) -> Held:
    """Raise unless ``current`` may move as ``change`` says, for the holder of its lease token."""
    if current is None:
        raise StaleTransitionError(turn_id, f"Turn {turn_id} does not exist.")
    if current.status not in change.expected:
        raise StaleTransitionError(
            turn_id,
            f"Turn {turn_id} is {current.status.value}, expected one of "
            f"{sorted(s.value for s in change.expected)}.",
        )
    lease_token = change.lease_token
    if lease_token is not None and current.lease_token != lease_token:
        raise LeaseLostError(turn_id, f"Lease {lease_token} on turn {turn_id} was lost.")
    if not can_transition(current.status, change.new):
        raise ValueError(f"No transition {current.status.value} → {change.new.value}.")
    return current


def check_not_busy(session_id: str, active: tuple[str, TurnStatus] | None) -> None:
    """A session runs one turn at a time: ``active`` (its running turn's id and status, if
    any) must be ``None`` for a new turn to join it."""
    if active is None:
        return
    active_id, active_status = active
    raise SessionBusyError(
        f"Session {session_id} already has a running turn ({active_id}, "
        f"{active_status.value}); wait for it to settle or abort it.",
        snapshot_id=active_id,
    )


@dataclass(frozen=True)
class CreationRefused:
    """What a store saw of a session when it refused to create a turn in it, for
    :func:`check_creation` to name the rule that refused."""

    #: The session, if it exists.
    session: SessionRecord | None
    #: The id and status of the session's running turn, if any.
    active: tuple[str, TurnStatus] | None
    #: The session's latest turn, if any.
    latest_id: str | None
    #: Whether a turn with the new turn's id exists already.
    id_taken: bool
    #: The journal rows the answers name, by ``(round, ref)`` (missing: no such call).
    calls: Mapping[tuple[int, str], ToolCallRecord] = field(default_factory=dict)


def check_creation(
    turn: NewTurn, answers: Sequence[InterruptAnswer], seen: CreationRefused
) -> None:
    """Raise the error of the first rule ``turn`` breaks, in the order the reference
    transaction checks them; return if it breaks none (the refusal was a race)."""
    if seen.session is not None:
        check_session(seen.session, turn)
    check_not_busy(turn.session_id, seen.active)
    for answer in answers:
        check_answerable(seen.calls.get((answer.round, answer.ref)), answer)
    if seen.id_taken:
        raise InvalidArgumentError(f"Turn {turn.id} already exists.")
    check_parent(turn, seen.latest_id)


def transition_changes(change: Transition, lease_token: int, now: datetime) -> dict[str, Any]:
    """The fields ``change`` sets, checked, as ``TurnRecord`` field names and values, for a
    turn whose current lease token is ``lease_token``."""
    new, error = change.new, change.error
    changes: dict[str, Any] = {"status": new, "updated_at": now}
    if new is not TurnStatus.ABORTING:
        # Settling, or handing the turn back for a retry, releases the lease; the token moves
        # on so the releasing worker can write nothing more.
        changes.update(lease_owner=None, lease_expires_at=None, lease_token=lease_token + 1)
    if new is TurnStatus.PENDING:
        changes["run_after"] = change.run_after or now
    if change.finish_reason is not None:
        changes["finish_reason"] = change.finish_reason
    if new not in ACTIVE_STATUSES:
        # A settled turn carries exactly the error it settled with (none when it completed),
        # not one left over from an earlier attempt.
        changes["settled_at"] = now
        changes["error"] = error.model_copy(deep=True) if error is not None else None
    elif error is not None:
        changes["error"] = error.model_copy(deep=True)
    return changes


def abort_target(turn: TurnRecord, now: datetime) -> tuple[TurnStatus, FinishReason | None] | None:
    """Where an abort request moves ``turn``: ``aborting`` while a live lease holds it,
    ``aborted`` when nobody does, nowhere (``None``) unless it is ``pending``."""
    if turn.status is not TurnStatus.PENDING:
        return None
    leased = turn.lease_expires_at is not None and turn.lease_expires_at >= now
    if leased:
        return TurnStatus.ABORTING, None
    return TurnStatus.ABORTED, FinishReason.ABORTED


async def claim_after(store: SessionStore, claim: FollowOnClaim) -> None:
    """Run a transition's follow-on claim as an ordinary claim (stores without a combined
    form), recording what it leased in ``claim``."""
    if not claim.wanted:
        return
    claim.claimed = await store.claim_next(
        owner=claim.owner,
        lease_seconds=claim.lease_seconds,
        limit=claim.limit,
        agents=claim.agents,
        versions=claim.versions,
    )
    claim.ran = True


def apply_change(current: Assignment, change: AssignmentChange, now: datetime) -> Assignment | None:
    """``current`` after ``change`` (``None``: the change's guard refuses it); the rules the
    SQL stores write as guarded UPDATEs, for the in-memory store."""
    now = change.at or now
    stamp: dict[str, Any] = {"assigned_by": change.by, "assigned_at": now}
    if change.action == "claim":
        if current.assignee not in (None, change.by):
            return None
        return current.model_copy(update={"assignee": change.by, **stamp})
    if change.action == "assign":
        if change.group is not None:
            stamp.update(group=change.group, assignee=change.assignee)
        else:
            stamp["assignee"] = change.assignee
        return current.model_copy(update=stamp)
    if change.action == "release":
        if current.assignee is None or change.holder not in (None, current.assignee):
            return None
        return current.model_copy(update={"assignee": None, **stamp})
    if change.action == "escalate":
        if current.escalation_step != change.from_step:
            return None
        return current.model_copy(
            update={
                "escalation_step": change.from_step + 1,
                "escalated_from_assignee": current.assignee,
                "escalated_from_group": current.group,
                "escalated_to": change.group,
                "escalated_at": now,
                "group": change.group,
                "assignee": None,
                **stamp,
            }
        )
    assert change.every_seconds is not None, "a reminder needs its interval"
    last = current.last_reminded_at
    if last is not None and last > now - timedelta(seconds=change.every_seconds):
        return None
    return current.model_copy(update={"last_reminded_at": now, "reminders": current.reminders + 1})


def check_recorded(row: ToolCallRecord, answer: Any, snapshot_id: str | None = None) -> None:
    """Refuse ``answer`` for a call whose recorded decision (an approver's, through the
    inbox) says something else: a recorded answer is final on every path."""
    if row.decided_at is None or same_answer(row.answer, answer):
        return
    raise DecisionConflictError(
        f"Interrupt '{row.name}' (ref: {row.ref}) was already decided by "
        f"{row.decided_by or 'an anonymous approver'} with {json.dumps(row.answer)}; a "
        "different answer is refused. Resume with the recorded answer, or leave it to the "
        "inbox.",
        snapshot_id=snapshot_id,
    )


def same_answer(recorded: Any, answer: Any) -> bool:
    """Whether two journal answers are the same decision (deep JSON equality)."""
    return canonical_json(recorded) == canonical_json(answer)


def settled_fields(settlement: WebhookSettlement) -> dict[str, Any]:
    """What recording ``settlement`` changes on its delivery: the lease released, and the
    delivery delivered, given up, or due again at ``retry_at`` with the attempt's error."""
    fields: dict[str, Any] = {"lease_token": None, "lease_expires_at": None}
    if settlement.outcome == "delivered":
        fields.update(status="delivered", delivered_at=settlement.at, last_error=None)
    elif settlement.outcome == "failed":
        fields.update(status="failed", last_error=settlement.error)
    else:
        fields.update(next_attempt_at=settlement.retry_at, last_error=settlement.error)
    return fields
