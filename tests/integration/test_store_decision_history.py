"""The store contract for the inbox UI's reads: decided approvals (the history) and open
approvals newest first, on every store (in memory, SQLite, PostgreSQL)."""

from __future__ import annotations

from engine.status import FinishReason, TurnStatus
from engine.store import (
    ApprovalHistory,
    ApprovalQuery,
    AssignmentChange,
    DecisionQuery,
    SessionStore,
)
from tests.integration.store_support import (
    AGENT,
    answer,
    new_turn,
    paused_turn,
    record_decision,
    settle,
)


def history_of(store: SessionStore) -> ApprovalHistory:
    return store


async def test_open_approvals_page_newest_first(store: SessionStore) -> None:
    """``descending`` reverses the order and the cursor: pages never repeat an entry."""
    await paused_turn(store, "p1", "s1", interrupted=("a", "b", "c"))
    await paused_turn(store, "p2", "s2")
    oldest_first = await store.list_approvals(ApprovalQuery())
    newest_first = await store.list_approvals(ApprovalQuery(descending=True))
    assert newest_first == list(reversed(oldest_first))
    first = await store.list_approvals(ApprovalQuery(descending=True, limit=2))
    last = first[-1]
    rest = await store.list_approvals(
        ApprovalQuery(descending=True, after=(last.created_at, last.turn_id, last.ref))
    )
    assert first + rest == newest_first


async def test_decisions_list_who_decided_what_and_the_turn_that_followed(
    store: SessionStore,
) -> None:
    """An inbox decision is in the history at once, without a continuing turn; once the
    resume exists it names it with its status. Undecided approvals are not listed."""
    history = history_of(store)
    await paused_turn(store, "p1", "s1", interrupted=("a", "b"))
    await paused_turn(store, "p2", "s2")
    assert await history.list_decisions(DecisionQuery()) == []

    await record_decision(store, "p1", 1, "a", answer={"respond": True}, decided_by="bob")
    [entry] = await history.list_decisions(DecisionQuery())
    assert (entry.turn_id, entry.ref, entry.interrupt) == ("p1", "a", "transferMoney")
    assert (entry.session_id, entry.agent, entry.decided_by) == ("s1", AGENT, "bob")
    assert entry.answer == {"respond": True}
    assert entry.next_turn_id is None and entry.next_status is None

    await record_decision(store, "p1", 1, "b", answer={"respond": False}, decided_by="carol")
    resume = new_turn("p1-resume", "s1", kind="resume", parent_id="p1")
    await store.create_turn(
        resume, answers=[answer("p1", "a", True, "bob"), answer("p1", "b", False, "carol")]
    )
    decided = await history.list_decisions(DecisionQuery())
    assert [(e.ref, e.decided_by) for e in decided] == [("b", "carol"), ("a", "bob")]
    assert {(e.next_turn_id, e.next_status) for e in decided} == {("p1-resume", TurnStatus.PENDING)}
    await settle(store, "p1-resume")
    settled = await history.list_decisions(DecisionQuery())
    assert {(e.next_status, e.next_finish_reason) for e in settled} == {
        (TurnStatus.COMPLETED, FinishReason.STOP)
    }


async def test_decisions_filter_and_page(store: SessionStore) -> None:
    """Filters by agent, interrupt, requester and decider; keyset pages newest first."""
    history = history_of(store)
    await paused_turn(store, "p1", "s1", interrupted=("a", "b", "c"))
    for ref, who in (("a", "bob"), ("b", "carol"), ("c", "bob")):
        await record_decision(store, "p1", 1, ref, answer={"respond": ref}, decided_by=who)
    everything = await history.list_decisions(DecisionQuery())
    assert [e.ref for e in everything] == ["c", "b", "a"]
    assert [e.ref for e in await history.list_decisions(DecisionQuery(decided_by="bob"))] == [
        "c",
        "a",
    ]
    assert await history.list_decisions(DecisionQuery(interrupt="other")) == []
    assert await history.list_decisions(DecisionQuery(agents=("elsewhere",))) == []
    assert await history.list_decisions(DecisionQuery(owner="nobody")) == []
    first = await history.list_decisions(DecisionQuery(limit=2))
    rest = await history.list_decisions(DecisionQuery(before=first[-1].key))
    assert first + rest == everything


async def test_decisions_name_the_escalation_before_them(store: SessionStore) -> None:
    """An approval escalated before its decision is listed with when, from which group and
    holder, and to which group; one never escalated (even if claimed) lists none."""
    history = history_of(store)
    await paused_turn(store, "p1", "s1", interrupted=("a", "b"))
    claim = AssignmentChange(action="claim", by="dave")
    for ref in ("a", "b"):
        await store.change_assignment("p1", 1, ref, claim, default_group="payments")
    escalate = AssignmentChange(action="escalate", by="escalation", group="leads")
    moved = await store.change_assignment("p1", 1, "a", escalate, default_group="payments")
    assert moved is not None and moved.escalated_at is not None
    await record_decision(store, "p1", 1, "a", answer={"respond": True}, decided_by="lena")
    await record_decision(store, "p1", 1, "b", answer={"respond": True}, decided_by="dave")
    by_ref = {e.ref: e for e in await history.list_decisions(DecisionQuery())}
    escalated = by_ref["a"]
    assert escalated.escalated_at == moved.escalated_at
    assert (escalated.escalated_from_group, escalated.escalated_from_assignee) == (
        "payments",
        "dave",
    )
    assert escalated.escalated_to == "leads"
    claimed_only = by_ref["b"]
    assert claimed_only.escalated_at is None and claimed_only.escalated_to is None
