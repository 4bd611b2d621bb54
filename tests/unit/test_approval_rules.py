"""The rules of changing an open approval (engine/approvals/rules.py), as pure functions of
the approval a store read under its lock: quorum, denial, edit resets, repeated votes and
the assignment check, decided once for every store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from engine.approvals.rules import decision_rule, vote_rule
from engine.store import (
    EDIT,
    AlreadyVotedError,
    Assignment,
    AssignmentChangedError,
    EditedMeanwhileError,
    OpenApproval,
    ToolCallRecord,
    ToolCallStatus,
    Vote,
)

NOW = datetime(2026, 12, 6, tzinfo=UTC)
APPROVE = {"respond": {"approved": True}}
DENY = {"respond": {"approved": False}}


def approval(*votes: Vote, assignment: Assignment | None = None) -> OpenApproval:
    call = ToolCallRecord(
        turn_id="t1",
        round=1,
        ref="approval-1",
        name="userApproval",
        input={"amount": 40},
        status=ToolCallStatus.INTERRUPTED,
        idempotency_key="t1:approval-1",
    )
    return OpenApproval(call=call, votes=list(votes), assignment=assignment, now=NOW)


def vote(voter: str, answer: Any = APPROVE, approves: bool = True) -> Vote:
    return Vote(
        turn_id="t1",
        round=1,
        ref="approval-1",
        voter=voter,
        answer=answer,
        approves=approves,
        voted_at=NOW,
    )


def test_an_approval_short_of_the_quorum_is_counted_and_decides_nothing() -> None:
    """The first of two required approvals adds a vote and records no decision."""
    rule = vote_rule(voter="bob", answer=APPROVE, approves=True, required=2, edit_seen=None)
    change = rule(approval())
    assert change.vote is not None and change.vote.voter == "bob"
    assert not change.decides


def test_the_approval_that_completes_the_quorum_decides_with_its_answer() -> None:
    """The second approval of two decides, with its voter as the decider."""
    rule = vote_rule(voter="carol", answer=APPROVE, approves=True, required=2, edit_seen=None)
    change = rule(approval(vote("bob")))
    assert change.decides and change.answer == APPROVE and change.decided_by == "carol"


def test_a_denial_decides_at_once_whatever_the_quorum() -> None:
    """A vote that does not approve decides the approval on its own."""
    rule = vote_rule(voter="bob", answer=DENY, approves=False, required=3, edit_seen=None)
    assert rule(approval()).decides


def test_a_voter_counts_once() -> None:
    """A second vote by the same approver is refused, writing nothing."""
    rule = vote_rule(voter="bob", answer=APPROVE, approves=True, required=2, edit_seen=None)
    with pytest.raises(AlreadyVotedError):
        rule(approval(vote("bob")))


def test_an_edit_clears_the_votes_on_other_arguments_and_counts_from_one() -> None:
    """A vote that edits resets the count: the earlier approvals approved other arguments."""
    edited = {**APPROVE, EDIT: {"input": {"amount": 500}}}
    rule = vote_rule(
        voter="bob", answer=edited, approves=True, required=2, edit_seen=None, resets=True
    )
    change = rule(approval(vote("bob"), vote("carol", approves=True)))
    assert change.clear_votes and not change.decides


def test_a_vote_on_arguments_edited_since_it_was_read_is_refused() -> None:
    """The votes stand on an edit the voter did not see: the vote is not counted."""
    standing = {"input": {"amount": 500}}
    rule = vote_rule(voter="carol", answer=APPROVE, approves=True, required=2, edit_seen=None)
    with pytest.raises(EditedMeanwhileError):
        rule(approval(vote("bob", answer={**APPROVE, EDIT: standing})))


def test_a_decision_after_a_reassignment_is_refused() -> None:
    """The decider was checked against an assignment that has changed since."""
    seen = Assignment(turn_id="t1", round=1, ref="approval-1", assignee="bob", assigned_at=NOW)
    now = seen.model_copy(update={"assignee": "carol"})
    rule = decision_rule(APPROVE, decided_by="bob", assignment_seen=seen)
    with pytest.raises(AssignmentChangedError):
        rule(approval(assignment=now))
    assert rule(approval(assignment=seen)).decides


def test_a_voter_whose_id_differs_only_in_case_or_width_counts_once() -> None:
    """``Bob`` and a full-width ``bob`` are bob: their second vote is refused."""
    for twin in ("Bob", "\uff42ob"):
        rule = vote_rule(voter=twin, answer=APPROVE, approves=True, required=2, edit_seen=None)
        with pytest.raises(AlreadyVotedError):
            rule(approval(vote("bob")))
