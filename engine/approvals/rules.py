"""The rules of changing an open approval, written once for every store: what a decision
or a vote writes, checked against the approval as its store read it under its row's lock.

A store runs a rule inside the transaction that holds the approval's journal row
(:meth:`engine.store.VoteBook.change_approval`), so nothing a rule checks can change before
what it decides lands: the assignment the decider was checked against, the edit a voter
read, who voted already, and how many approvals the quorum still needs. Who may vote at all
(the policy's approvers, maker-checker) is checked before, by :func:`engine.approvals.decide`.
"""

from __future__ import annotations

from typing import Any

from engine.approval_policy import same_principal
from engine.approvals.edits import check_edit_seen
from engine.store import (
    AlreadyVotedError,
    ApprovalChange,
    ApprovalRule,
    Assignment,
    AssignmentChangedError,
    OpenApproval,
    Vote,
)

__all__ = ["check_assignment_seen", "decision_rule", "vote_rule"]


def decision_rule(
    answer: Any, *, decided_by: str | None, assignment_seen: Assignment | None = None
) -> ApprovalRule:
    """Record ``answer`` as the approval's decision, by ``decided_by`` (an approval with no
    policy: one decision decides). With ``assignment_seen`` (the assignment the decider was
    checked against) the approval's assignment must not have changed since."""

    def rule(approval: OpenApproval) -> ApprovalChange:
        _check_assignment(approval, assignment_seen)
        return ApprovalChange(decides=True, answer=answer, decided_by=decided_by)

    return rule


def vote_rule(
    *,
    voter: str,
    answer: Any,
    approves: bool,
    required: int,
    edit_seen: dict[str, Any] | None,
    resets: bool = False,
    assignment_seen: Assignment | None = None,
) -> ApprovalRule:
    """Add ``voter``'s vote and, when it does not approve or it brings the approvals to
    ``required``, record its ``answer`` as the decision.

    The votes must still stand on ``edit_seen``, the edit the voter read
    (:func:`engine.approvals.edits.standing_edit`; ``None``: the original arguments), else
    :class:`~engine.store.EditedMeanwhileError`: a vote counts only towards the arguments its
    voter saw. With ``resets`` (a vote that edits the arguments) the earlier votes are
    cleared first: they approved other arguments. A voter who voted already is refused with
    :class:`~engine.store.AlreadyVotedError`; a changed assignment with
    :class:`~engine.store.AssignmentChangedError`.
    """

    def rule(approval: OpenApproval) -> ApprovalChange:
        call = approval.call
        check_edit_seen(call.turn_id, call.ref, edit_seen, approval.votes)
        _check_assignment(approval, assignment_seen)
        counted = [] if resets else approval.votes
        if any(same_principal(vote.voter, voter) for vote in counted):
            raise AlreadyVotedError(
                f"'{voter}' already voted on interrupt '{call.ref}' of snapshot "
                f"{call.turn_id}; a vote counts once."
            )
        vote = Vote(
            turn_id=call.turn_id,
            round=call.round,
            ref=call.ref,
            voter=voter,
            answer=answer,
            approves=approves,
            voted_at=approval.now,
        )
        approvals = sum(v.approves for v in counted) + approves
        return ApprovalChange(
            clear_votes=resets,
            vote=vote,
            decides=not approves or approvals >= required,
            answer=answer,
            decided_by=voter,
        )

    return rule


def _check_assignment(approval: OpenApproval, seen: Assignment | None) -> None:
    if seen is not None:
        call = approval.call
        check_assignment_seen(call.turn_id, call.ref, seen, approval.assignment)


def check_assignment_seen(
    turn_id: str, ref: str, seen: Assignment, stored: Assignment | None
) -> None:
    """Refuse a decision or vote whose decider was checked against the assignment ``seen``
    when the approval's stored assignment (``None``: none stored) has changed since. Stores
    call it under the lock that records the decision or vote, so that who may decide is what
    the check saw when the decision lands."""
    now = stored.version if stored is not None else None
    if now != seen.version:
        holder = stored.describe() if stored is not None else "its default"
        raise AssignmentChangedError(
            f"Interrupt '{ref}' of snapshot {turn_id} was reassigned while your decision was "
            f"being recorded (it is now assigned to {holder}); nothing was recorded.",
            snapshot_id=turn_id,
        )
