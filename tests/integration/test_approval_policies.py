"""Approval policies enforced by the engine (engine.approvals.decide.decide) on every store:
maker-checker refusals, a two-person quorum, one denial deciding, and each vote recorded.

The concurrent-vote tests make the race wide and deterministic on PostgreSQL: a deferred
constraint trigger, created only in the test's own database, sleeps while carol's vote
commits — after her transaction counted the votes, before it commits — and dave's vote runs
meanwhile. Without the journal row's lock (``stores/approvals.py`` ``record_vote``), both
would count the votes with the other's uncommitted and neither would decide; with it, dave's
vote waits for carol's commit and then sees her vote.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import psycopg
import pytest
from sqlalchemy.engine import URL

from engine.approval_policy import ApprovalPolicy, ApprovalRefusedError, role
from engine.approvals.decide import Decision, decide, find_approval
from engine.approvals.rules import vote_rule
from engine.conversation.parts import Message, Part
from engine.errors import ApprovalNotPendingError
from engine.remote.auth import Principal
from engine.status import FinishReason, TurnStatus
from engine.store import (
    AlreadyVotedError,
    PendingApproval,
    SessionStore,
    ToolCallStatus,
    TurnInput,
    VoteOutcome,
)
from engine.turns.request import TurnRequest
from examples.banking import BankingApp, build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, sql_store

ALICE = Principal("alice", roles=frozenset({"approver"}))  # the requester, an approver too
BOB = Principal("bob", roles=frozenset({"approver"}))
CAROL = Principal("carol", roles=frozenset({"approver"}))
MALLORY = Principal("mallory")  # no approver role

APPROVE = Decision(respond={"approved": True})
DENY = Decision(respond={"approved": False})

VoteResult = TypeVar("VoteResult")

SLOW_VOTER = "carol"
SLEEP_SECONDS = 1.0

# Sleeps at the commit of SLOW_VOTER's vote: after its transaction counted the votes (and
# while it holds the journal row's lock), before its vote is visible to anyone else.
SLOW_VOTE_COMMIT = f"""
CREATE FUNCTION slow_vote_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep({SLEEP_SECONDS});
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_vote_commit AFTER INSERT ON approval_votes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.voter = '{SLOW_VOTER}')
    EXECUTE FUNCTION slow_vote_commit();
"""


@dataclass
class Paused:
    """A banking app whose session (owned by alice) is paused at one approval."""

    app: BankingApp
    store: SessionStore
    approval: PendingApproval

    async def vote(self, who: Principal, decision: Decision = APPROVE) -> bool:
        """Decide as ``who``; whether the decision is recorded (the vote closed it)."""
        outcome = await decide(
            self.app.banking_agent, self.approval, decision, decided_by=who.id, approver=who
        )
        return outcome.is_decided

    async def turn_status(self) -> tuple[TurnStatus, FinishReason | None]:
        latest = await self.store.latest_turn(self.approval.session_id)
        assert latest is not None
        return latest.status, latest.finish_reason


async def paused(store: SessionStore, policy: ApprovalPolicy) -> Paused:
    """alice asks for a transfer; the turn pauses at userApproval under ``policy``."""
    app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
    app.user_approval.approval_policy = policy
    response = await app.banking_agent.run_turn(
        TurnRequest(
            input=TurnInput(kind="message", message=Message.user("transfer $40 to carol")),
            owner="alice",
        )
    )
    assert response.finish_reason is FinishReason.INTERRUPTED
    assert response.snapshot_id is not None
    found = await find_approval(store, response.snapshot_id, "approval-1")
    assert found is not None and found[1]
    return Paused(app=app, store=store, approval=found[0])


async def journal_row(ctx: Paused) -> tuple[ToolCallStatus, object, str | None]:
    for call in await ctx.store.list_calls(ctx.approval.turn_id):
        if call.ref == ctx.approval.ref:
            return call.status, call.answer, call.decided_by
    raise AssertionError("no journal row")


async def test_requester_may_not_approve_under_maker_checker(store: SessionStore) -> None:
    """The session's owner may not approve its own request; nothing is written."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver")))
    with pytest.raises(ApprovalRefusedError) as refused:
        await ctx.vote(ALICE)
    assert refused.value.status == "PERMISSION_DENIED"
    assert await journal_row(ctx) == (ToolCallStatus.INTERRUPTED, None, None)
    assert await store.list_votes(ctx.approval.turn_id, 1, "approval-1") == []
    assert await ctx.vote(BOB) is True
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.STOP)
    assert [request.amount for _key, request in ctx.app.transfers] == [40]


async def test_a_principal_outside_the_approvers_is_refused(store: SessionStore) -> None:
    """The predicate decides who may vote; an anonymous caller cannot be checked at all."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver")))
    with pytest.raises(ApprovalRefusedError, match="mallory"):
        await ctx.vote(MALLORY)
    with pytest.raises(ApprovalRefusedError, match="authenticated"):
        await decide(ctx.app.banking_agent, ctx.approval, APPROVE, decided_by=None)
    assert await journal_row(ctx) == (ToolCallStatus.INTERRUPTED, None, None)


async def test_requester_may_deny_its_own_request(store: SessionStore) -> None:
    """Maker-checker forbids approving, not withdrawing: the requester's denial decides."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver"), required_approvals=2))
    assert await ctx.vote(ALICE, DENY) is True
    _status, answer, decided_by = await journal_row(ctx)
    assert (answer, decided_by) == ({"respond": {"approved": False}}, "alice")
    assert ctx.app.transfers == []


async def test_two_person_quorum(store: SessionStore) -> None:
    """The first approval leaves the turn paused and the decision unwritten; the same approver
    again does not count; a second distinct approver's vote decides and resumes the turn."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver"), required_approvals=2))
    assert await ctx.vote(BOB) is False
    assert await journal_row(ctx) == (ToolCallStatus.INTERRUPTED, None, None)
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
    found = await find_approval(store, ctx.approval.turn_id, ctx.approval.ref)
    assert found is not None and found[1], "still open after one vote"

    with pytest.raises(AlreadyVotedError):
        await ctx.vote(BOB)
    assert await journal_row(ctx) == (ToolCallStatus.INTERRUPTED, None, None)

    assert await ctx.vote(CAROL) is True
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.STOP)
    assert [request.amount for _key, request in ctx.app.transfers] == [40]
    status, answer, decided_by = await journal_row(ctx)
    assert (status, answer, decided_by) == (
        ToolCallStatus.ANSWERED,
        {"respond": {"approved": True}},
        "carol",
    )
    votes = await store.list_votes(ctx.approval.turn_id, 1, "approval-1")
    assert [(v.voter, v.approves, v.answer) for v in votes] == [
        ("bob", True, {"respond": {"approved": True}}),
        ("carol", True, {"respond": {"approved": True}}),
    ]
    assert votes[0].voted_at <= votes[1].voted_at
    with pytest.raises(ApprovalNotPendingError):
        await ctx.vote(Principal("dave", roles=frozenset({"approver"})))


async def test_one_denial_decides_at_once(store: SessionStore) -> None:
    """Under a quorum of two, an approval then a denial: the denial is the decision."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver"), required_approvals=2))
    assert await ctx.vote(BOB) is False
    assert await ctx.vote(CAROL, DENY) is True
    _status, answer, decided_by = await journal_row(ctx)
    assert (answer, decided_by) == ({"respond": {"approved": False}}, "carol")
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.STOP)
    assert ctx.app.transfers == []


async def test_a_chat_resume_cannot_skip_the_policy(store: SessionStore) -> None:
    """The requester answering its own interrupt through a resume is refused: an interrupt
    with a policy is answered only from the decision its votes recorded."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver")))
    resume = TurnInput(
        kind="resume",
        respond=[Part.of_response("userApproval", "approval-1", {"approved": True})],
    )
    with pytest.raises(ApprovalRefusedError, match="inbox"):
        await ctx.app.banking_agent.run_turn(
            TurnRequest(input=resume, snapshot_id=ctx.approval.turn_id, owner="alice")
        )
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
    assert ctx.app.transfers == []


def postgres_url_of(store: SessionStore) -> URL | None:
    """The database URL of a store on PostgreSQL; None for any other store."""
    if isinstance(store, SqlSessionStore) and store.db.is_postgres:
        return store.url
    return None


def slow_down_commits_of_the_slow_voter(url: URL) -> None:
    """Install the trigger that holds SLOW_VOTER's vote at its commit (this database only)."""
    with psycopg.connect(libpq_dsn(url), autocommit=True) as admin:
        admin.execute(SLOW_VOTE_COMMIT)


async def wait_until_a_vote_sleeps(url: URL, timeout: float = 10.0) -> None:
    """Return once a backend of this database sleeps in the trigger: the slow vote has
    counted the votes and is committing."""
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(libpq_dsn(url), autocommit=True) as admin:
        while time.monotonic() < deadline:
            cursor = await admin.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event = 'PgSleep'"
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the slow voter's commit never started sleeping")


async def overlapping(
    slow_vote: Awaitable[VoteResult], other_vote: Awaitable[VoteResult], url: URL | None
) -> list[VoteResult]:
    """Run both votes at once; on PostgreSQL, start ``other_vote`` only while ``slow_vote``
    sleeps in its commit, so that the two transactions overlap."""
    if url is None:
        return list(await asyncio.gather(slow_vote, other_vote))
    slow = asyncio.ensure_future(slow_vote)
    try:
        await wait_until_a_vote_sleeps(url)
        other = await other_vote
        return [await slow, other]
    finally:
        # A failure before the slow vote finished must not leave its task running on.
        slow.cancel()


async def test_concurrent_last_votes_decide_once(store: SessionStore) -> None:
    """Two approvers casting the last two votes of a quorum of three at once: votes are
    counted one after the other, so exactly one of them decides and the turn resumes once."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver"), required_approvals=3))
    assert await ctx.vote(BOB) is False
    dave = Principal("dave", roles=frozenset({"approver"}))
    url = postgres_url_of(store)
    if url is not None:
        slow_down_commits_of_the_slow_voter(url)
    outcomes = await overlapping(ctx.vote(CAROL), ctx.vote(dave), url)
    assert sorted(outcomes) == [False, True]
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.STOP)
    assert [request.amount for _key, request in ctx.app.transfers] == [40]
    assert len(await store.list_votes(ctx.approval.turn_id, 1, "approval-1")) == 3


async def last_vote(store: SqlSessionStore, ctx: Paused, voter: str) -> VoteOutcome:
    """``voter``'s approval, recorded straight through ``store``, under a quorum of three."""
    return await store.change_approval(
        ctx.approval.turn_id,
        1,
        "approval-1",
        vote_rule(voter=voter, answer=True, approves=True, required=3, edit_seen=None),
    )


async def test_votes_from_two_processes_count_one_after_the_other() -> None:
    """Two stores on one PostgreSQL database (as two server processes have) record the last
    two votes of a quorum of three at once: dave's vote, cast while carol's commits, waits for
    it and sees her vote, so exactly one of them writes the decision."""
    async with sql_store("postgres") as first:
        ctx = await paused(first, ApprovalPolicy(approvers=role("approver"), required_approvals=3))
        slow_down_commits_of_the_slow_voter(first.url)
        second = SqlSessionStore(first.url.render_as_string(hide_password=False))
        try:
            await last_vote(first, ctx, "bob")
            carol, dave = await overlapping(
                last_vote(first, ctx, SLOW_VOTER), last_vote(second, ctx, "dave"), first.url
            )
        finally:
            await second.close()
        assert (carol.decided, [v.voter for v in carol.votes]) == (None, ["bob", "carol"])
        assert dave.decided is not None and dave.decided.decided_by == "dave"
        assert [v.voter for v in dave.votes] == ["bob", "carol", "dave"]
        votes = await first.list_votes(ctx.approval.turn_id, 1, "approval-1")
        assert len(votes) == 3


async def test_retention_takes_the_votes_with_the_session(store: SessionStore) -> None:
    """Pruning a settled session deletes its votes (the journal rows they belong to go)."""
    ctx = await paused(store, ApprovalPolicy(approvers=role("approver"), required_approvals=2))
    assert await ctx.vote(BOB) is False
    assert await ctx.vote(CAROL) is True
    assert len(await store.list_votes(ctx.approval.turn_id, 1, "approval-1")) == 2
    later = datetime.now(UTC) + timedelta(seconds=5)
    assert await store.prune_sessions(settled_before=later) == 1
    assert await store.list_votes(ctx.approval.turn_id, 1, "approval-1") == []
