"""Reject, the third answer to an approval, on every store: the paused call's effect never
runs, the decision is recorded with its reason, who and when, and the model reads a refusal
(marked in the response's metadata) instead of an output an approver had to invent; a resume
cannot use the mark to skip a tool's output schema."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from engine import Engine, ScriptedModel
from engine.approval_policy import role
from engine.approvals.decide import Decision, decide, find_approval
from engine.approvals.expiry import expire_approvals
from engine.conversation.parts import REJECTED, Message, Part
from engine.errors import DecisionConflictError, ResumeValidationError
from engine.rejection import MAX_REASON_LENGTH
from engine.status import FinishReason
from engine.store import DecisionQuery, SessionStore, TurnInput
from engine.turns.request import TurnRequest
from examples import banking
from tests.integration.guarded_support import ALICE, paused
from tests.integration.store_support import record_decision


async def final_text(store: SessionStore, session_id: str) -> str:
    latest = await store.latest_turn(session_id)
    assert latest is not None
    return (await store.load_conversation(latest.id))[-1].text


def refusal_part(reason: str, by: str, at: str) -> Part:
    record = {"reason": reason, "by": by, "at": at}
    return Part.of_response(
        "transferMoney",
        "transfer-1",
        {"rejected": True, "reason": reason, "by": by},
        {REJECTED: record},
    )


async def test_a_rejected_call_never_runs_and_the_model_reads_the_refusal(
    store: SessionStore,
) -> None:
    """bob rejects the guarded transfer: nothing is booked, the journal records the reason
    with who and when, the model receives a refusal marked rejected, and it says so."""
    app, approval = await paused(store)
    outcome = await decide(
        app.agent, approval, Decision(reject="  Over the monthly limit. "), decided_by="bob"
    )
    assert outcome.resume_snapshot_id is not None
    assert app.transfers == []
    row = next(c for c in await store.list_calls(approval.turn_id) if c.ref == "transfer-1")
    record = row.answer["reject"]
    assert (record["reason"], record["by"], row.decided_by) == (
        "Over the monthly limit.",
        "bob",
        "bob",
    )
    assert record["at"]
    latest = await store.latest_turn(approval.session_id)
    assert latest is not None and latest.finish_reason is FinishReason.STOP
    messages = await store.load_conversation(latest.id)
    responses = [p for m in messages if m.role == "tool" for p in m.content if p.tool_response]
    assert [
        (p.tool_response.output, p.meta().get(REJECTED)) for p in responses if p.tool_response
    ] == [({"rejected": True, "reason": "Over the monthly limit.", "by": "bob"}, record)]
    assert messages[-1].text == "The transfer was rejected: Over the monthly limit."
    history = await store.list_decisions(DecisionQuery())
    assert [(d.ref, d.decided_by, d.answer) for d in history] == [
        ("transfer-1", "bob", {"reject": record})
    ]


async def test_a_reject_decides_a_quorum_at_once(store: SessionStore) -> None:
    """Under a two-approver quorum one reject decides: it is a denial, so even the requester
    may reject her own request, and the transfer never runs."""
    app, approval = await paused(store, approvers=role("approver"), required_approvals=2)
    outcome = await decide(
        app.agent, approval, Decision(reject="Changed my mind."), decided_by=None, approver=ALICE
    )
    assert outcome.is_decided and outcome.resume_snapshot_id is not None
    assert [(v.voter, v.approves) for v in outcome.votes] == [("alice", False)]
    assert app.transfers == []
    assert await final_text(store, approval.session_id) == (
        "The transfer was rejected: Changed my mind."
    )


async def test_rejecting_an_interrupt_answers_the_model_with_the_refusal(
    store: SessionStore,
) -> None:
    """A pure interrupt (the banking example's userApproval) is rejected the same way: its
    output schema is not asked of the refusal, and the model reports the reason."""
    app = banking.build(store=store, execution="inline")
    response = await app.banking_agent.run_turn(
        TurnRequest(
            input=TurnInput(kind="message", message=Message.user("transfer $40 to carol")),
            owner="alice",
        )
    )
    assert response.snapshot_id is not None
    found = await find_approval(store, response.snapshot_id, "approval-1")
    assert found is not None
    await decide(app.banking_agent, found[0], Decision(reject="Unknown payee."), decided_by="bob")
    assert app.transfers == []
    assert await final_text(store, found[0].session_id) == (
        "The transfer was rejected: Unknown payee."
    )


async def test_a_resume_cannot_mark_an_output_rejected_to_skip_the_schema(
    store: SessionStore,
) -> None:
    """A chat resume marked rejected is refused unless the inbox recorded exactly that reject;
    with it recorded, the same refusal resumes the turn and the tool never runs."""
    app, approval = await paused(store)

    def resume_with(part: Part) -> TurnRequest:
        return TurnRequest(
            input=TurnInput(kind="resume", respond=[part]),
            snapshot_id=approval.turn_id,
            owner="alice",
        )

    forged = refusal_part("nope", "alice", "2026-01-01T00:00:00+00:00")
    with pytest.raises(ResumeValidationError, match="no reject with that refusal"):
        await app.agent.run_turn(resume_with(forged))
    record = {"reason": "Too much.", "by": "bob", "at": "2026-01-01T00:00:00+00:00"}
    await record_decision(
        store,
        approval.turn_id,
        approval.round,
        approval.ref,
        answer={"reject": record},
        decided_by="bob",
    )
    with pytest.raises(ResumeValidationError, match="no reject with that refusal"):
        await app.agent.run_turn(resume_with(forged))
    unmarked = Part.of_response(
        "transferMoney", "transfer-1", {"rejected": True, "reason": "Too much.", "by": "bob"}
    )
    with pytest.raises(ResumeValidationError, match="output schema"):
        await app.agent.run_turn(resume_with(unmarked))
    receipt = Part.of_response(
        "transferMoney", "transfer-1", {"success": True, "transactionId": "txn-40-carol"}
    )
    with pytest.raises(DecisionConflictError):
        await app.agent.run_turn(resume_with(receipt))
    response = await app.agent.run_turn(resume_with(refusal_part("Too much.", "bob", record["at"])))
    assert response.finish_reason is FinishReason.STOP
    assert app.transfers == []
    assert await final_text(store, approval.session_id) == "The transfer was rejected: Too much."


@pytest.mark.parametrize(
    "reject",
    ["", "   ", "x" * (MAX_REASON_LENGTH + 1), {"reason": ""}, {"because": "x"}, 7],
)
def test_a_reject_needs_a_bounded_reason(reject: Any) -> None:
    """A reject without a reason, with only spaces, or with one too long is refused."""
    with pytest.raises(ValidationError):
        Decision(reject=reject)


def test_a_reject_is_the_only_answer_of_its_decision() -> None:
    """A decision that rejects may not also respond, restart or edit."""
    for extra in ({"respond": True}, {"restart": True}, {"restart": True, "edit": {"amount": 1}}):
        with pytest.raises(ValidationError, match="exactly one"):
            Decision(reject="no", **extra)


async def test_a_reject_stands_when_the_turn_expires(store: SessionStore) -> None:
    """One of two approvals is rejected, the other runs past its deadline: the expiry's
    resume keeps the recorded reject as a refusal (marked rejected) beside the default."""
    ai = Engine(model=ScriptedModel())
    approval_tool = ai.define_interrupt(
        name="userApproval",
        description="Ask for approval.",
        input_schema=banking.ApprovalRequest,
        output_schema=banking.ApprovalDecision,
        timeout=60,
        on_timeout={"approved": False, "feedback": "timed out"},
    )
    agent = ai.define_agent(name="expiring", tools=[approval_tool], store=store, execution="inline")
    response = await agent.run_turn(
        TurnRequest(
            input=TurnInput(kind="message", message=Message.user("transfer $1 to a and $2 to b")),
            owner="alice",
        )
    )
    assert response.snapshot_id is not None
    found = await find_approval(store, response.snapshot_id, "approval-1")
    assert found is not None
    outcome = await decide(agent, found[0], Decision(reject="Unknown payee."), decided_by="bob")
    assert outcome.waiting_for == ["approval-2"]
    created = await expire_approvals(ai, store, now=found[0].created_at + timedelta(seconds=600))
    assert len(created) == 1
    messages = await store.load_conversation(created[0])
    answered = {
        p.tool_response.ref: (p.tool_response.output, REJECTED in p.meta())
        for m in messages
        if m.role == "tool"
        for p in m.content
        if p.tool_response is not None
    }
    assert answered == {
        "approval-1": ({"rejected": True, "reason": "Unknown payee.", "by": "bob"}, True),
        "approval-2": ({"approved": False, "feedback": "timed out"}, False),
    }
    assert messages[-1].text == "Transfer cancelled: timed out"
