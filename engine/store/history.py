"""What a turn's history records, and the words of each entry, for every store.

A turn's history (``turn_events`` on SQL, a list per turn in the in-memory store) is
append-only: each change of a turn, its journal or its approvals adds an entry in the
transaction that makes the change, and nothing rewrites one. Status transitions are entries of
kind ``status``; the others are the kinds below. The SQL stores write claims with the claim
(:mod:`stores.turn_claims`: on PostgreSQL in the claim statement, whose SQL spells the words of
:func:`claim_entries`; on SQLite through this function), tool calls from the statements
writing the journal (:mod:`stores.history`, whose SQL on PostgreSQL spells the words of
:func:`call_entries`), and decisions, votes and assignment changes with
:func:`stores.history.append_history`; the in-memory store applies these functions itself, so
every store's :meth:`engine.store.TurnTimeline.timeline` tells the same story.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from engine.store.records import (
    EDIT,
    Assignment,
    AssignmentChange,
    ToolCallRecord,
    ToolCallStatus,
    TurnRecord,
    Vote,
    WebhookDelivery,
    WebhookSettlement,
)

__all__ = [
    "ASSIGNMENT",
    "CLAIMED",
    "DECIDED",
    "ESCALATION",
    "FINISHED_KINDS",
    "LEASE_LOST",
    "PAUSED",
    "REMINDER",
    "STATUS",
    "TOOL_STARTED",
    "VOTE",
    "WEBHOOK",
    "HistoryEntry",
    "assignment_entry",
    "call_entries",
    "claim_entries",
    "claimed_entry",
    "decision_entry",
    "decision_summary",
    "decision_words",
    "delivery_entry",
    "settlement_entry",
    "vote_entry",
]

STATUS = "status"
CLAIMED = "claimed"
LEASE_LOST = "lease lost"
TOOL_STARTED = "tool started"
PAUSED = "paused"
DECIDED = "decided"
VOTE = "vote"
ASSIGNMENT = "assignment"
ESCALATION = "escalation"
REMINDER = "reminder"
WEBHOOK = "webhook"

#: The journal key of a reject's record (engine.rejection.REJECT, a floor above this one).
_REJECT = "reject"

#: A call's statuses that end a run of it, and the kind of entry each records.
FINISHED_KINDS = {
    ToolCallStatus.DONE: "tool done",
    ToolCallStatus.FAILED: "tool failed",
    ToolCallStatus.INTERRUPTED: PAUSED,
}


@dataclass(frozen=True)
class HistoryEntry:
    """One entry to append to a turn's history (``attempt`` ``None``: the turn's current)."""

    kind: str
    note: str
    at: datetime
    actor: str | None = None
    detail: dict[str, Any] | None = field(default=None)
    attempt: int | None = None


def claim_entries(before: TurnRecord, claimed: TurnRecord) -> list[HistoryEntry]:
    """A claim's entries: the lease it took over when its previous worker's expired (a claim
    only finds a lease owner left on a turn whose worker died), then the claim itself."""
    entries = []
    if before.lease_owner is not None:
        entries.append(
            HistoryEntry(
                kind=LEASE_LOST,
                note=f"lease of {before.lease_owner} expired (attempt {before.attempts})",
                at=before.lease_expires_at or claimed.updated_at,
                actor=before.lease_owner,
                attempt=before.attempts,
            )
        )
    assert claimed.lease_owner is not None  # a claim always leases
    entries.append(claimed_entry(claimed.lease_owner, claimed.attempts, claimed.updated_at))
    return entries


def claimed_entry(owner: str, attempt: int, at: datetime) -> HistoryEntry:
    """The entry of ``owner`` taking the lease for ``attempt``: by a claim, or by the creator
    of a turn that runs it itself (see :meth:`engine.store.TurnQueue.create_claimed_turn`)."""
    return HistoryEntry(
        kind=CLAIMED, note=f"claimed by {owner} (attempt {attempt})", at=at, actor=owner
    )


def _call_detail(call: ToolCallRecord) -> dict[str, Any]:
    return {"round": call.round, "ref": call.ref, "name": call.name}


def call_entries(
    before: ToolCallRecord | None, after: ToolCallRecord, worker: str | None, now: datetime
) -> list[HistoryEntry]:
    """The entries a journal write records, run by ``worker``: a (re)start of the call, and
    its end (done, failed, or paused on an interrupt) when its status became one.

    A call that starts and pauses in one write records the pause alone: an interrupt is
    control flow that stopped the call where it began, and the pause names the same call."""
    entries = []
    what = f"{after.name} {after.ref}"
    # The end this write records, if its status became an ending one.
    moved = before is None or before.status is not after.status
    kind = FINISHED_KINDS.get(after.status) if moved else None
    started_at = after.started_at
    if (
        started_at is not None
        and (before is None or before.started_at != started_at)
        and kind != PAUSED
    ):
        entries.append(
            HistoryEntry(
                kind=TOOL_STARTED,
                note=what,
                at=started_at,
                actor=worker,
                detail=_call_detail(after),
            )
        )
    if kind is not None:
        entries.append(
            HistoryEntry(
                kind=kind,
                note=what,
                at=after.finished_at or now,
                actor=worker,
                detail=_call_detail(after),
            )
        )
    return entries


def decision_words(answer: Any) -> str:
    """What an answer did to its approval, in a word or two (``rejected``, ``approved``...)."""
    if not isinstance(answer, dict):
        return "answered"
    if _REJECT in answer:
        return "rejected"
    if EDIT in answer:
        return "edited and approved"
    if "restart" in answer:
        return "restarted"
    respond = answer.get("respond")
    if isinstance(respond, dict) and isinstance(respond.get("approved"), bool):
        respond = respond["approved"]
    if respond is True:
        return "approved"
    if respond is False:
        return "denied"
    return "answered"


def decision_summary(answer: Any, decided_by: str | None) -> str:
    """What a decision did and who made it (``rejected by bob: too risky``): a reject shows
    its reason."""
    summary = f"{decision_words(answer)} by {decided_by or 'unknown'}"
    if isinstance(answer, dict) and isinstance(answer.get(_REJECT), dict):
        reason = answer[_REJECT].get("reason")
        if reason:
            summary += f": {reason}"
    return summary


def decision_entry(
    call: ToolCallRecord, answer: Any, decided_by: str | None, at: datetime
) -> HistoryEntry:
    """The entry of a decision on ``call``."""
    return HistoryEntry(
        kind=DECIDED,
        note=f"{call.name} {call.ref} {decision_summary(answer, decided_by)}",
        at=at,
        actor=decided_by,
        detail={**_call_detail(call), "answer": answer},
    )


def vote_entry(call: ToolCallRecord, vote: Vote) -> HistoryEntry:
    """The entry of one approver's vote on ``call``."""
    words = "approves" if vote.approves else decision_words(vote.answer)
    if isinstance(vote.answer, dict) and EDIT in vote.answer and vote.approves:
        words += " with an edit"
    return HistoryEntry(
        kind=VOTE,
        note=f"{call.name} {call.ref}: {vote.voter} {words}",
        at=vote.voted_at,
        actor=vote.voter,
        detail={**_call_detail(call), "answer": vote.answer, "approves": vote.approves},
    )


def assignment_entry(
    ref: str, change: AssignmentChange, assignment: Assignment, at: datetime
) -> HistoryEntry:
    """The entry of a change of who holds approval ``ref`` (a claim, an assignment, a
    release, an escalation or a reminder), as it left the approval's ``assignment``."""
    holder = assignment.describe()
    if change.action == "escalate":
        kind, note = ESCALATION, f"{ref} escalated to {holder}"
    elif change.action == "remind":
        kind, note = REMINDER, f"{ref} reminder {assignment.reminders} ({holder})"
    elif change.action == "claim":
        kind, note = ASSIGNMENT, f"{ref} claimed by {change.by or 'unknown'}"
    elif change.action == "release":
        kind, note = ASSIGNMENT, f"{ref} released by {change.by or 'unknown'} ({holder})"
    else:
        kind, note = ASSIGNMENT, f"{ref} assigned to {holder} by {change.by or 'unknown'}"
    return HistoryEntry(
        kind=kind,
        note=note,
        at=at,
        actor=change.by,
        detail={"ref": ref, "action": change.action, "holder": holder},
    )


def delivery_entry(
    delivery: WebhookDelivery, outcome: str, at: datetime, error: str | None = None
) -> HistoryEntry:
    """A webhook delivery's entry: ``outcome`` is ``queued`` (written with the change it
    reports), ``delivered``, ``retrying`` or ``given up`` (one per attempt's outcome).

    Only the endpoint's host is recorded: a webhook URL's path often is its secret (Slack's
    are), and the history is shown to approvers."""
    host = urlsplit(delivery.url).netloc or "the endpoint"
    note = f"{delivery.event} to {host} {outcome}" + (f": {error}" if error else "")
    return HistoryEntry(
        kind=WEBHOOK,
        note=note,
        at=at,
        detail={
            "round": delivery.round,
            "ref": delivery.ref,
            "event": delivery.event,
            "host": host,
            "outcome": outcome,
            "attempts": delivery.attempts,
        },
    )


#: How each outcome of an attempt reads on the timeline.
_SETTLED_WORDS = {
    "delivered": "delivered",
    "retry": "failed, retrying",
    "failed": "failed, given up",
}


def settlement_entry(delivery: WebhookDelivery, settlement: WebhookSettlement) -> HistoryEntry:
    """The entry of one attempt's outcome at ``delivery`` (as claimed for that attempt)."""
    return delivery_entry(
        delivery, _SETTLED_WORDS[settlement.outcome], settlement.at, settlement.error
    )
