"""Edit before approve, enforced by the engine on every store: an approver's edit of a paused
call's arguments is validated, recorded as a diff with who and when, and the call runs once
with the edited arguments; non-editable tools, disallowed approvers and a restart with
changed input that no edit recorded are refused and change nothing."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from engine.approval_policy import ApprovalRefusedError, role
from engine.approvals.decide import Decision, DecisionOutcome, decide
from engine.approvals.rules import vote_rule
from engine.conversation.parts import RESUMED, Part
from engine.errors import (
    DecisionConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    ResumeValidationError,
)
from engine.status import FinishReason, TurnStatus
from engine.store import (
    DecisionQuery,
    EditedMeanwhileError,
    PendingApproval,
    SessionStore,
    ToolCallRecord,
    TurnInput,
    VoteBook,
)
from engine.tools import ToolContext
from engine.turns.request import TurnRequest
from engine.turns.resume import edited_key
from examples.banking import read_ledger
from tests.databases import sql_store
from tests.integration.guarded_support import ALICE, BOB, CAROL, MALLORY, paused
from tests.integration.store_support import record_decision
from tests.integration.test_approval_policies import (
    SLOW_VOTER,
    overlapping,
    slow_down_commits_of_the_slow_voter,
)

EDIT_TO_500 = Decision(restart=True, edit={"amount": 500})


async def paused_row(store: SessionStore, approval: PendingApproval) -> ToolCallRecord:
    rows = [c for c in await store.list_calls(approval.turn_id) if c.ref == approval.ref]
    assert len(rows) == 1
    return rows[0]


def book_of(store: SessionStore) -> VoteBook:
    return store


def where(approval: PendingApproval) -> tuple[str, int, str]:
    return approval.turn_id, approval.round, approval.ref


async def latest_status(store: SessionStore, session_id: str) -> tuple[TurnStatus, Any]:
    latest = await store.latest_turn(session_id)
    assert latest is not None
    return latest.status, latest.finish_reason


async def test_edited_call_runs_once_with_the_edited_arguments(store: SessionStore) -> None:
    """The edit is recorded as a diff with who and when, the transfer runs exactly once with
    amount 500 under a key covering the edited arguments, and the history shows the edit."""
    app, approval = await paused(store)
    outcome = await decide(app.agent, approval, EDIT_TO_500, decided_by="bob")
    assert outcome.resume_snapshot_id is not None
    assert await latest_status(store, approval.session_id) == (
        TurnStatus.COMPLETED,
        FinishReason.STOP,
    )
    original_key = f"{approval.turn_id}:transfer-1"
    assert [(key, r.amount, r.toAccount) for key, r in app.transfers] == [
        (edited_key(original_key, {"amount": 500, "toAccount": "carol"}), 500, "carol")
    ]
    row = await paused_row(store, approval)
    edit = row.answer["edit"]
    assert edit["input"] == {"amount": 500, "toAccount": "carol"}
    assert edit["diff"] == [{"field": "amount", "old": 40, "new": 500}]
    assert edit["by"] == "bob" and edit["at"]
    assert row.decided_by == "bob"
    resumed = [c for c in await store.list_calls(outcome.resume_snapshot_id) if c.round == 0]
    assert [(c.input, c.idempotency_key) for c in resumed] == [(edit["input"], app.transfers[0][0])]
    final = await store.latest_turn(approval.session_id)
    assert final is not None
    messages = await store.load_conversation(final.id)
    assert "Done. Transaction txn-500-carol." in messages[-1].text
    history = await store.list_decisions(DecisionQuery())
    assert [(d.ref, d.decided_by, d.edit and d.edit["diff"]) for d in history] == [
        ("transfer-1", "bob", [{"field": "amount", "old": 40, "new": 500}])
    ]


async def test_edit_violating_the_input_schema_changes_nothing(store: SessionStore) -> None:
    """An amount that is not a number, or an unknown shape, is a typed error; the approval
    stays open and nothing ran."""
    app, approval = await paused(store)
    for bad in ({"amount": "lots"}, {"toAccount": None}, {}):
        with pytest.raises(InvalidArgumentError):
            await decide(app.agent, approval, Decision(restart=True, edit=bad), decided_by="bob")
    row = await paused_row(store, approval)
    assert (row.decided_at, row.answer) == (None, None)
    assert app.transfers == []
    with pytest.raises(ValueError, match="'edit' goes with 'restart'"):
        Decision(respond={"success": True, "transactionId": "x"}, edit={"amount": 1})


async def test_non_editable_tool_refuses_edits(store: SessionStore) -> None:
    """A tool not declared editable=True may only be approved as it is."""
    app, approval = await paused(store, editable=False)
    with pytest.raises(FailedPreconditionError, match="not editable"):
        await decide(app.agent, approval, EDIT_TO_500, decided_by="bob")
    assert (await paused_row(store, approval)).decided_at is None
    await decide(app.agent, approval, Decision(restart=True), decided_by="bob")
    assert [r.amount for _key, r in app.transfers] == [40]


async def test_only_an_allowed_approver_may_edit(store: SessionStore) -> None:
    """Under an approval policy, a principal outside the approvers and the requester
    (maker-checker) are refused before the edit is even looked at; an allowed one edits."""
    app, approval = await paused(store, approvers=role("approver"))
    for who in (MALLORY, ALICE):
        with pytest.raises(ApprovalRefusedError):
            await decide(app.agent, approval, EDIT_TO_500, decided_by=who.id, approver=who)
    assert (await paused_row(store, approval)).decided_at is None
    outcome = await decide(app.agent, approval, EDIT_TO_500, decided_by="bob", approver=BOB)
    assert outcome.is_decided
    assert [r.amount for _key, r in app.transfers] == [500]


async def test_an_edit_resets_the_quorum(store: SessionStore) -> None:
    """With two approvals required, an edit discards the votes cast on the old arguments:
    bob's earlier approval no longer counts; bob's own later edit builds on carol's and resets
    again; the turn resumes once carol approves the arguments as both edits left them."""
    app, approval = await paused(store, approvers=role("approver"), required_approvals=2)
    approve = Decision(restart=True)
    assert not (
        await decide(app.agent, approval, approve, decided_by="bob", approver=BOB)
    ).is_decided
    edited = await decide(app.agent, approval, EDIT_TO_500, decided_by="carol", approver=CAROL)
    assert not edited.is_decided
    assert [v.voter for v in edited.votes] == ["carol"]
    read_before = Decision(restart=True, arguments={"amount": 40, "toAccount": "carol"})
    with pytest.raises(EditedMeanwhileError):
        await decide(app.agent, approval, read_before, decided_by="bob", approver=BOB)
    assert [v.voter for v in await book_of(store).list_votes(*where(approval))] == ["carol"]
    again = Decision(restart=True, edit={"toAccount": "dave"})
    edited_again = await decide(app.agent, approval, again, decided_by="bob", approver=BOB)
    assert [v.voter for v in edited_again.votes] == ["bob"], "the second edit resets too"
    final = await decide(app.agent, approval, approve, decided_by="carol", approver=CAROL)
    assert final.is_decided
    assert [(r.amount, r.toAccount) for _key, r in app.transfers] == [(500, "dave")]
    row = await paused_row(store, approval)
    assert row.answer["edit"]["by"] == "bob"
    assert row.answer["edit"]["diff"] == [
        {"field": "amount", "old": 40, "new": 500},
        {"field": "toAccount", "old": "carol", "new": "dave"},
    ]
    votes = await store.list_votes(approval.turn_id, approval.round, approval.ref)
    assert [(v.voter, v.answer["edit"]["input"]) for v in votes] == [
        ("bob", {"amount": 500, "toAccount": "dave"}),
        ("carol", {"amount": 500, "toAccount": "dave"}),
    ]


async def test_restart_with_changed_input_is_refused_without_an_edit(
    store: SessionStore,
) -> None:
    """Genkit's rule holds outside the inbox's edit: a chat's restart with other arguments is
    refused, and once an edit is recorded only exactly its arguments are accepted."""
    app, approval = await paused(store)

    def restart_with(amount: int) -> TurnRequest:
        part = Part.of_request(
            "transferMoney", "transfer-1", {"amount": amount, "toAccount": "carol"}, {RESUMED: True}
        )
        return TurnRequest(
            input=TurnInput(kind="resume", restart=[part]),
            snapshot_id=approval.turn_id,
            owner="alice",
        )

    with pytest.raises(ResumeValidationError, match="modified inputs"):
        await app.agent.run_turn(restart_with(500))
    assert app.transfers == []
    # A decision recorded without an edit licenses no other arguments either.
    await record_decision(
        store,
        approval.turn_id,
        approval.round,
        approval.ref,
        answer={"restart": True},
        decided_by="bob",
    )
    with pytest.raises(ResumeValidationError, match="modified inputs"):
        await app.agent.run_turn(restart_with(500))
    assert app.transfers == []


async def test_a_recorded_edit_licenses_exactly_its_arguments(store: SessionStore) -> None:
    """A chat resume may carry out a recorded edit, but only with exactly the edited
    arguments; other arguments are still refused."""
    app, approval = await paused(store)
    edit = {
        "input": {"amount": 500, "toAccount": "carol"},
        "diff": [{"field": "amount", "old": 40, "new": 500}],
        "by": "bob",
        "at": "2026-01-01T00:00:00+00:00",
    }
    await record_decision(
        store,
        approval.turn_id,
        approval.round,
        approval.ref,
        answer={"restart": True, "edit": edit},
        decided_by="bob",
    )

    def restart_with(amount: int) -> TurnRequest:
        part = Part.of_request(
            "transferMoney", "transfer-1", {"amount": amount, "toAccount": "carol"}, {RESUMED: True}
        )
        return TurnRequest(
            input=TurnInput(kind="resume", restart=[part]),
            snapshot_id=approval.turn_id,
            owner="alice",
        )

    with pytest.raises(ResumeValidationError, match="modified inputs"):
        await app.agent.run_turn(restart_with(600))
    with pytest.raises(DecisionConflictError):
        await app.agent.run_turn(restart_with(40))
    assert app.transfers == []
    response = await app.agent.run_turn(restart_with(500))
    assert response.finish_reason is FinishReason.STOP
    assert [r.amount for _key, r in app.transfers] == [500]


async def test_a_retried_edited_call_keeps_its_key(store: SessionStore, tmp_path: Path) -> None:
    """The edited transfer books, then fails before the journal knows: the retry runs the
    edited call again under the same key, so the ledger books 500 once and 40 never."""
    ledger = tmp_path / "ledger.jsonl"
    app, approval = await paused(store, ledger=ledger)
    book_then_fail = app.transfer_money.fn
    assert book_then_fail is not None
    failures: list[str] = []

    def flaky(request: Any, ctx: ToolContext) -> Any:
        result = book_then_fail(request, ctx)
        if not failures:
            failures.append(ctx.idempotency_key)
            raise RuntimeError("the bank's confirmation was lost")
        return result

    app.transfer_money.fn = flaky
    outcome = await decide(app.agent, approval, EDIT_TO_500, decided_by="bob")
    failed = await store.get_turn(outcome.resume_snapshot_id or "")
    assert failed is not None and failed.status is TurnStatus.FAILED
    retried = await app.agent.run_turn(
        TurnRequest(input=TurnInput(kind="retry"), snapshot_id=failed.id, owner="alice")
    )
    assert retried.finish_reason is FinishReason.STOP
    keys = [key for key, _request in app.transfers]
    assert [r.amount for _key, r in app.transfers] == [500, 500]
    assert keys == [failures[0], failures[0]] and ":edited-" in keys[0]
    assert [(e["amount"], e["key"]) for e in read_ledger(ledger)] == [(500, failures[0])]


async def vote_or_refusal(vote: Awaitable[DecisionOutcome]) -> DecisionOutcome | Exception:
    """The outcome of ``vote``, or the edited-meanwhile refusal it raised."""
    try:
        return await vote
    except EditedMeanwhileError as refused:
        return refused


async def test_an_approval_racing_an_edit_never_completes_the_quorum() -> None:
    """On PostgreSQL, bob approves while carol's edit commits (bob read the votes before it,
    and counts them after it): bob's vote, taken on the arguments as they were, is refused
    and not counted, so the edit and a stale approval never make a quorum of two; bob's
    approval read anew completes it and the edited transfer runs once."""
    async with sql_store("postgres") as store:
        app, approval = await paused(store, approvers=role("approver"), required_approvals=2)
        assert CAROL.id == SLOW_VOTER, "the trigger slows down carol's commit"
        slow_down_commits_of_the_slow_voter(store.url)
        approve = Decision(restart=True)
        edited, stale = await overlapping(
            decide(app.agent, approval, EDIT_TO_500, decided_by="carol", approver=CAROL),
            vote_or_refusal(decide(app.agent, approval, approve, decided_by="bob", approver=BOB)),
            store.url,
        )
        assert isinstance(edited, DecisionOutcome) and not edited.is_decided
        assert isinstance(stale, EditedMeanwhileError), "a stale approval completed the quorum"
        assert stale.status == "ABORTED"
        assert [v.voter for v in await store.list_votes(*where(approval))] == ["carol"]
        assert (await paused_row(store, approval)).decided_at is None
        assert app.transfers == []
        final = await decide(app.agent, approval, approve, decided_by="bob", approver=BOB)
        assert final.is_decided
        assert [(r.amount, r.toAccount) for _key, r in app.transfers] == [(500, "carol")]


async def test_a_vote_on_a_replaced_edit_is_not_counted(store: SessionStore) -> None:
    """Each store checks the edit a vote was cast on under the lock that counts the votes: an
    approval read before carol's edit, and one read before bob's edit replaced hers, are
    refused and change nothing; a vote on the standing edit counts and decides."""
    app, approval = await paused(store, approvers=role("approver"), required_approvals=2)
    book = book_of(store)
    first = await decide(app.agent, approval, EDIT_TO_500, decided_by="carol", approver=CAROL)
    carols = first.votes[0].answer["edit"]

    async def approve_having_read(edit_seen: dict[str, Any] | None, voter: str) -> None:
        answer = {"restart": True, **({"edit": edit_seen} if edit_seen else {})}
        await book.change_approval(
            *where(approval),
            vote_rule(voter=voter, answer=answer, approves=True, required=2, edit_seen=edit_seen),
        )

    with pytest.raises(EditedMeanwhileError, match="500"):
        await approve_having_read(None, "dave")
    again = Decision(restart=True, edit={"toAccount": "dave"})
    await decide(app.agent, approval, again, decided_by="bob", approver=BOB)
    with pytest.raises(EditedMeanwhileError, match="dave"):
        await approve_having_read(carols, "erin")
    votes = await book.list_votes(*where(approval))
    assert [v.voter for v in votes] == ["bob"]
    assert (await paused_row(store, approval)).decided_at is None
    await approve_having_read(votes[0].answer["edit"], "erin")
    row = await paused_row(store, approval)
    assert (row.decided_by, row.answer["edit"]["input"]) == (
        "erin",
        {"amount": 500, "toAccount": "dave"},
    )
