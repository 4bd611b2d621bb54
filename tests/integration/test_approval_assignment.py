"""Assignment, escalation and reminders of approvals (engine.approvals.assignment) on every store:
who may claim, assign, release and decide; an overdue approval escalating once without being
decided; reminders once per interval; two sweeps at once on PostgreSQL escalating once; a chain
moved one step at a time, each once, by two sweeps at once on PostgreSQL and SQLite, and no
further once decided; a decision and an escalation at once on PostgreSQL never both written.

The concurrent tests make the race wide on PostgreSQL: a deferred constraint trigger, created
only in the test's own database, sleeps at the commit of an escalation (or of a decision), and
the other writer runs meanwhile. Without the guard on ``escalation_step`` (the step the sweep
moves from, ``stores/assignments.py``), the second sweep would escalate again once the first
commits; without the assignment guard of a
decision (the journal row lock every assignment change takes, and the assignment the decider
saw checked under it), a decision checked before an escalation committed would be recorded
after it, and an escalation would move an approval a decision had just closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
import pytest

from engine.approval_policy import ApprovalPolicy, ApprovalRefusedError
from engine.approvals.assignment import (
    assign,
    claim,
    current_assignment,
    release,
    sweep_assignments,
)
from engine.approvals.decide import Decision, decide, find_approval
from engine.approvals.expiry import expire_approvals
from engine.approvals.rules import vote_rule
from engine.conversation.parts import Message
from engine.errors import ApprovalNotPendingError
from engine.escalation import escalation_chain
from engine.remote.auth import Principal
from engine.status import FinishReason, TurnStatus
from engine.store import (
    ApprovalClaimedError,
    Assignment,
    AssignmentChange,
    AssignmentChangedError,
    DecisionQuery,
    PendingApproval,
    SessionStore,
    ToolCallRecord,
    TurnInput,
)
from engine.turns.request import TurnRequest
from examples.banking import BankingApp, build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, sql_store
from tests.integration.store_support import record_decision
from workers.metrics import Metrics

DAVE = Principal("dave", roles=frozenset({"payments"}))
ERIN = Principal("erin", roles=frozenset({"payments"}))
LEAD = Principal("lena", roles=frozenset({"leads"}))
OUTSIDER = Principal("oscar", roles=frozenset({"approver"}))

APPROVE = Decision(respond={"approved": True})

# Sleeps at the commit of an escalation: after the sweep's UPDATE, before anyone sees it.
SLOW_ESCALATION_COMMIT = """
CREATE FUNCTION slow_escalation_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(1.0);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_escalation_commit AFTER UPDATE ON approval_assignments
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.escalated_at IS NOT NULL)
    EXECUTE FUNCTION slow_escalation_commit();
"""

# Sleeps at the commit of dave's decision: after its UPDATE of the journal row (which it holds
# locked), before anyone sees the approval decided.
SLOW_DECISION_COMMIT = """
CREATE FUNCTION slow_decision_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(1.0);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_decision_commit AFTER UPDATE ON tool_calls
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.decided_at IS NULL AND NEW.decided_at IS NOT NULL AND NEW.decided_by = 'dave')
    EXECUTE FUNCTION slow_decision_commit();
"""


@dataclass
class Paused:
    """A banking app whose session (owned by alice) is paused at one approval of group
    ``payments`` that escalates to ``leads`` after a minute and reminds every minute."""

    app: BankingApp
    store: SessionStore
    approval: PendingApproval

    async def assignment(self) -> Assignment:
        return await current_assignment(self.app.banking_agent, self.approval)

    async def turn_status(self) -> tuple[TurnStatus, FinishReason | None]:
        latest = await self.store.latest_turn(self.approval.session_id)
        assert latest is not None
        return latest.status, latest.finish_reason

    def at(self, seconds: float) -> datetime:
        return self.approval.created_at + timedelta(seconds=seconds)


#: A chain: to leads a minute after the approval was asked, to directors two minutes later.
CHAIN = {"escalate": [("leads", 60), ("directors", 120)]}


async def paused(
    store: SessionStore, *, escalate: bool = True, remind: bool = False, chain: bool = False
) -> Paused:
    """alice asks for a transfer; the turn pauses at userApproval, assigned to payments (and
    escalating to leads after a minute, or along :data:`CHAIN` with ``chain``)."""
    app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
    interrupt = app.user_approval
    interrupt.group = "payments"
    if escalate:
        on_timeout = CHAIN if chain else {"escalate": "leads"}
        interrupt.escalation = escalation_chain(interrupt.name, on_timeout, timeout=60)
    if remind:
        interrupt.remind_every = 60.0
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


async def test_a_group_assignment_restricts_who_decides(store: SessionStore) -> None:
    """An approval assigned to a group is decided only by its members; others are refused and
    nothing is written."""
    ctx = await paused(store, escalate=False)
    agent = ctx.app.banking_agent
    assert (await ctx.assignment()).group == "payments"
    with pytest.raises(ApprovalRefusedError, match="group payments"):
        await decide(agent, ctx.approval, APPROVE, decided_by="oscar", approver=OUTSIDER)
    with pytest.raises(ApprovalRefusedError, match="authenticated"):
        await decide(agent, ctx.approval, APPROVE, decided_by=None)
    assert ctx.app.transfers == []
    outcome = await decide(agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
    assert outcome.is_decided
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.STOP)


async def test_claim_release_and_reassign(store: SessionStore) -> None:
    """A claim holds the approval against other claims; only its holder releases it; a group
    member may reassign it to another group, whose members alone may then decide it."""
    ctx = await paused(store, escalate=False)
    agent = ctx.app.banking_agent
    with pytest.raises(ApprovalRefusedError):
        await claim(agent, ctx.approval, OUTSIDER)
    held = await claim(agent, ctx.approval, DAVE)
    assert (held.assignee, held.group, held.assigned_by) == ("dave", "payments", "dave")
    assert (await claim(agent, ctx.approval, DAVE)).assignee == "dave"  # claiming again is fine
    with pytest.raises(ApprovalClaimedError, match="dave"):
        await claim(agent, ctx.approval, ERIN)
    with pytest.raises(ApprovalRefusedError, match="erin"):
        await release(agent, ctx.approval, by=ERIN)
    assert (await ctx.assignment()).assignee == "dave"
    released = await release(agent, ctx.approval, by=DAVE)
    assert (released.assignee, released.group) == (None, "payments")
    assert (await claim(agent, ctx.approval, ERIN)).assignee == "erin"

    with pytest.raises(ApprovalRefusedError):
        await assign(agent, ctx.approval, by=OUTSIDER, group="approver")
    moved = await assign(agent, ctx.approval, by=DAVE, group="leads")
    assert (moved.assignee, moved.group, moved.assigned_by) == (None, "leads", "dave")
    with pytest.raises(ApprovalRefusedError, match="group leads"):
        await decide(agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
    person = await assign(agent, ctx.approval, by=LEAD, assignee="oscar")
    assert (person.assignee, person.group) == ("oscar", "leads")
    outcome = await decide(agent, ctx.approval, APPROVE, decided_by="oscar", approver=OUTSIDER)
    assert outcome.is_decided
    with pytest.raises(ApprovalNotPendingError):
        await claim(agent, ctx.approval, LEAD)


async def test_an_operator_assigns_without_being_an_approver(store: SessionStore) -> None:
    """The operator CLI's path: no principal, named in the audit, any holder released."""
    ctx = await paused(store, escalate=False)
    agent = ctx.app.banking_agent
    await claim(agent, ctx.approval, DAVE)
    done = await assign(agent, ctx.approval, by=None, assignee="erin", operator="ops")
    assert (done.assignee, done.group, done.assigned_by) == ("erin", "payments", "ops")
    freed = await release(agent, ctx.approval, by=None, operator="ops")
    assert freed.assignee is None
    with pytest.raises(ApprovalRefusedError):
        await release(agent, ctx.approval, by=None, operator="ops")  # nobody holds it


async def test_an_overdue_approval_escalates_once_and_stays_open(store: SessionStore) -> None:
    """Past its timeout the sweep moves the approval from payments (and its claimant) to
    leads, recorded, once; it decides nothing and expiry leaves it alone; only leads decide."""
    ctx = await paused(store)
    agent, engine = ctx.app.banking_agent, ctx.app.ai
    await claim(agent, ctx.approval, DAVE)
    assert (await sweep_assignments(engine, store, now=ctx.at(30))).escalated == []
    report = await sweep_assignments(engine, store, now=ctx.at(61))
    assert [(a.turn_id, a.ref) for a in report.escalated] == [(ctx.approval.turn_id, "approval-1")]
    moved = await ctx.assignment()
    assert (moved.group, moved.assignee, moved.assigned_by) == ("leads", None, "escalation")
    assert (moved.escalated_from_group, moved.escalated_from_assignee) == ("payments", "dave")
    assert moved.escalated_to == "leads" and moved.escalated_at is not None
    assert (await sweep_assignments(engine, store, now=ctx.at(600))).escalated == []
    assert await expire_approvals(engine, store, now=ctx.at(600)) == []
    assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
    with pytest.raises(ApprovalRefusedError):
        await decide(agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
    assert (await decide(agent, ctx.approval, APPROVE, decided_by="lena", approver=LEAD)).is_decided
    assert (await sweep_assignments(engine, store, now=ctx.at(900))).escalated == []


async def test_reminders_once_per_interval(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An approval open past its reminder interval is reminded once per interval, however
    often the sweep runs, each reminder logged with the approval and its assignee."""
    ctx = await paused(store, escalate=False, remind=True)
    engine = ctx.app.ai
    await claim(ctx.app.banking_agent, ctx.approval, ERIN)
    caplog.set_level(logging.WARNING, logger="turnstile.assignment")
    counts = []
    for seconds in (30, 61, 62, 90, 121.5, 122, 150):
        report = await sweep_assignments(engine, store, now=ctx.at(seconds))
        counts.append(len(report.reminded))
    assert counts == [0, 1, 0, 0, 1, 0, 0]
    assert (await ctx.assignment()).reminders == 2
    lines = [r for r in caplog.records if "reminder" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].__dict__["assignee"] == "erin"
    assert lines[0].__dict__["approval_id"] == f"{ctx.approval.turn_id}:approval-1"
    assert lines[0].__dict__["session_id"] == ctx.approval.session_id


async def test_retention_takes_the_assignment_with_the_session(store: SessionStore) -> None:
    """Pruning a settled session deletes the assignments of its approvals."""
    ctx = await paused(store, escalate=False)
    await claim(ctx.app.banking_agent, ctx.approval, DAVE)
    await decide(ctx.app.banking_agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
    key = (ctx.approval.turn_id, 1, "approval-1")
    assert key in await store.get_assignments([key])
    await store.prune_sessions(settled_before=ctx.at(3600))
    assert await store.get_assignments([key]) == {}


async def wait_until_a_commit_sleeps(url: str, timeout: float = 10.0) -> None:
    """Return once a backend of this database sleeps in a slowed commit (the test's trigger)."""
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
    raise AssertionError("no commit started sleeping in the test's trigger")


async def test_two_sweeps_at_once_escalate_once() -> None:
    """Two stores on one PostgreSQL database (two worker processes) sweep at once: the second
    runs while the first's escalation commits, waits for it, and escalates nothing."""
    async with sql_store("postgres") as first:
        ctx = await paused(first)
        url = first.url.render_as_string(hide_password=False)
        async with second_worker(ctx) as (second_app, second):
            slow = asyncio.ensure_future(sweep_assignments(ctx.app.ai, first, now=ctx.at(61)))
            await wait_until_a_commit_sleeps(url)
            other = await sweep_assignments(second_app.ai, second, now=ctx.at(61))
            first_report = await slow
        assert len(first_report.escalated) + len(other.escalated) == 1
        assert len(first_report.escalated) == 1, "the sweep that slept escalated it"
        moved = await ctx.assignment()
        assert (moved.group, moved.escalated_from_group) == ("leads", "payments")


@contextlib.asynccontextmanager
async def second_worker(ctx: Paused) -> AsyncIterator[tuple[BankingApp, SqlSessionStore]]:
    """Another worker process's app and store on ``ctx``'s database, with the same interrupt
    settings; on PostgreSQL, each escalation's commit there is slowed (so two sweeps at once
    overlap)."""
    first = ctx.store
    assert isinstance(first, SqlSessionStore)
    if first.url.get_backend_name() == "postgresql":
        with psycopg.connect(libpq_dsn(first.url), autocommit=True) as admin:
            admin.execute(SLOW_ESCALATION_COMMIT)
    second = SqlSessionStore(first.url.render_as_string(hide_password=False))
    app = build(store=second, state_keys=TEST_STATE_KEYS, execution="inline")
    app.user_approval.group = ctx.app.user_approval.group
    app.user_approval.escalation = ctx.app.user_approval.escalation
    try:
        yield app, second
    finally:
        await second.close()


async def sweep_twice_at_once(
    ctx: Paused, second_app: BankingApp, second: SqlSessionStore, at: float
) -> int:
    """Two sweeps of one database at once, ``at`` seconds after the approval was asked; how
    many escalations they made together. On PostgreSQL the second runs while the first's
    escalation commits (:func:`second_worker` slows it); SQLite serialises writers, so there
    the two simply race."""
    first = ctx.store
    assert isinstance(first, SqlSessionStore)
    if first.url.get_backend_name() != "postgresql":
        reports = await asyncio.gather(
            sweep_assignments(ctx.app.ai, first, now=ctx.at(at)),
            sweep_assignments(second_app.ai, second, now=ctx.at(at)),
        )
        return sum(len(r.escalated) for r in reports)
    slow = asyncio.ensure_future(sweep_assignments(ctx.app.ai, first, now=ctx.at(at)))
    await wait_until_a_commit_sleeps(first.url.render_as_string(hide_password=False))
    other = await sweep_assignments(second_app.ai, second, now=ctx.at(at))
    return len((await slow).escalated) + len(other.escalated)


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_a_chain_moves_each_step_once_with_two_sweeps_at_once(backend: str) -> None:
    """Along payments → leads (after 60 s) → directors (120 s after that), two workers
    sweeping at once move the approval to leads once, then to directors once, each step
    recorded with where it came from; past the last step nothing moves it."""
    async with sql_store(backend) as first:
        ctx = await paused(first, chain=True)
        async with second_worker(ctx) as (second_app, second):

            async def moved_by_either(at: float) -> int:
                """Both workers sweep, one after the other, when nothing should be due."""
                one = await sweep_assignments(ctx.app.ai, first, now=ctx.at(at))
                two = await sweep_assignments(second_app.ai, second, now=ctx.at(at))
                return len(one.escalated) + len(two.escalated)

            assert await moved_by_either(59) == 0
            assert await sweep_twice_at_once(ctx, second_app, second, 61) == 1
            at_leads = await ctx.assignment()
            assert (at_leads.escalation_step, at_leads.group) == (1, "leads")
            assert at_leads.escalated_at == ctx.at(61)
            # Step 2 waits its 120 s from when step 1 happened, not from the creation.
            assert await moved_by_either(180) == 0
            assert await sweep_twice_at_once(ctx, second_app, second, 182) == 1
            at_directors = await ctx.assignment()
            assert (at_directors.escalation_step, at_directors.group) == (2, "directors")
            assert (at_directors.escalated_from_group, at_directors.escalated_to) == (
                "leads",
                "directors",
            )
            assert await moved_by_either(10_000) == 0


async def test_a_decided_approval_stops_the_chain(store: SessionStore) -> None:
    """An approval decided at the chain's first step is never moved to the next one, however
    late the sweep runs; its decision's history says the step it reached."""
    ctx = await paused(store, chain=True)
    agent, engine = ctx.app.banking_agent, ctx.app.ai
    assert len((await sweep_assignments(engine, store, now=ctx.at(61))).escalated) == 1
    assert (await decide(agent, ctx.approval, APPROVE, decided_by="lena", approver=LEAD)).is_decided
    assert (await sweep_assignments(engine, store, now=ctx.at(10_000))).escalated == []
    stored = await store.get_assignments([(ctx.approval.turn_id, ctx.approval.round, "approval-1")])
    assert [(a.escalation_step, a.group) for a in stored.values()] == [(1, "leads")]
    [decided] = await store.list_decisions(DecisionQuery())
    assert (decided.escalation_step, decided.escalated_to) == (1, "leads")


async def test_escalations_and_reminders_are_counted_per_agent(store: SessionStore) -> None:
    """The process's metrics count each escalation and each reminder once, for its agent."""
    metrics = Metrics(agents=["bankingAgent"])
    metrics.observe_engine()
    try:
        ctx = await paused(store, remind=True)
        for seconds in (61, 62, 125):
            await sweep_assignments(ctx.app.ai, store, now=ctx.at(seconds))

        def sample(name: str) -> float:
            return metrics.registry.get_sample_value(name, {"agent": "bankingAgent"}) or 0.0

        assert sample("turnstile_approval_escalations_total") == 1
        assert sample("turnstile_approval_reminders_total") == 2
    finally:
        metrics.close()


async def test_a_decision_or_vote_checked_against_a_stale_assignment_is_refused(
    store: SessionStore,
) -> None:
    """Each store checks, under the lock that records a decision or a vote, the assignment
    its decider was checked against: once erin claimed the approval, a vote and a decision
    checked before her claim are refused and write nothing; a reminder is no change; checked
    against her claim, the decision is recorded."""
    ctx = await paused(store, escalate=False)
    where = (ctx.approval.turn_id, 1, "approval-1")
    answer = APPROVE.answer()
    unclaimed = await ctx.assignment()
    remind = AssignmentChange(action="remind", every_seconds=60.0)
    assert await store.change_assignment(*where, remind, default_group="payments") is not None
    counted = await store.change_approval(
        *where,
        vote_rule(
            voter="dave",
            answer=answer,
            approves=True,
            required=2,
            edit_seen=None,
            assignment_seen=unclaimed,
        ),
    )
    assert [v.voter for v in counted.votes] == ["dave"] and counted.decided is None
    await claim(ctx.app.banking_agent, ctx.approval, ERIN)
    with pytest.raises(AssignmentChangedError, match="erin") as refused:
        await store.change_approval(
            *where,
            vote_rule(
                voter="frank",
                answer=answer,
                approves=True,
                required=2,
                edit_seen=None,
                assignment_seen=unclaimed,
            ),
        )
    assert refused.value.status == "ABORTED"  # HTTP 409
    with pytest.raises(AssignmentChangedError, match="erin"):
        await record_decision(
            store, *where, answer=answer, decided_by="dave", assignment_seen=unclaimed
        )
    assert [v.voter for v in await store.list_votes(*where)] == ["dave"]
    assert (await paused_row(ctx)).decided_at is None
    claimed = await ctx.assignment()
    decided = await record_decision(
        store, *where, answer=answer, decided_by="erin", assignment_seen=claimed
    )
    assert decided.decided_by == "erin"


async def paused_row(ctx: Paused) -> ToolCallRecord:
    rows = await ctx.store.list_calls(ctx.approval.turn_id)
    return next(row for row in rows if row.ref == "approval-1")


async def test_a_decision_racing_an_escalation_is_refused() -> None:
    """On PostgreSQL, dave decides the approval he claimed while the sweep's escalation to
    leads commits: he was checked against his claim before it, so his decision is refused
    (409) and nothing is written; the approval stays open with leads, whose decision runs the
    transfer once."""
    async with sql_store("postgres") as store:
        ctx = await paused(store)
        agent = ctx.app.banking_agent
        # Claimed first, so the escalation updates a stored row rather than inserting one
        # (whose foreign key check would lock the journal row and hide a missing guard).
        await claim(agent, ctx.approval, DAVE)
        url = store.url.render_as_string(hide_password=False)
        with psycopg.connect(libpq_dsn(store.url), autocommit=True) as admin:
            admin.execute(SLOW_ESCALATION_COMMIT)
        sweep = asyncio.ensure_future(sweep_assignments(ctx.app.ai, store, now=ctx.at(61)))
        try:
            await wait_until_a_commit_sleeps(url)
            with pytest.raises(AssignmentChangedError, match="group leads") as refused:
                await decide(agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
            report = await sweep
        finally:
            sweep.cancel()
        assert refused.value.status == "ABORTED"
        assert len(report.escalated) == 1
        assert (await paused_row(ctx)).decided_at is None
        assert ctx.app.transfers == []
        assert (await ctx.assignment()).group == "leads"
        outcome = await decide(agent, ctx.approval, APPROVE, decided_by="lena", approver=LEAD)
        assert outcome.is_decided and outcome.decided.decided_by == "lena"
        assert len(ctx.app.transfers) == 1


async def test_a_vote_racing_an_escalation_is_not_counted() -> None:
    """On PostgreSQL, under a quorum of two, dave votes on the approval he claimed while the
    sweep's escalation to leads commits: his vote is refused and not counted, since it was
    checked against his claim before the escalation."""
    async with sql_store("postgres") as store:
        ctx = await paused(store)
        agent = ctx.app.banking_agent
        ctx.app.user_approval.approval_policy = ApprovalPolicy(required_approvals=2)
        await claim(agent, ctx.approval, DAVE)
        url = store.url.render_as_string(hide_password=False)
        with psycopg.connect(libpq_dsn(store.url), autocommit=True) as admin:
            admin.execute(SLOW_ESCALATION_COMMIT)
        sweep = asyncio.ensure_future(sweep_assignments(ctx.app.ai, store, now=ctx.at(61)))
        try:
            await wait_until_a_commit_sleeps(url)
            with pytest.raises(AssignmentChangedError, match="group leads"):
                await decide(agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
            report = await sweep
        finally:
            sweep.cancel()
        assert len(report.escalated) == 1
        assert await store.list_votes(ctx.approval.turn_id, 1, "approval-1") == []
        assert (await paused_row(ctx)).decided_at is None


async def test_an_escalation_racing_a_decision_moves_nothing() -> None:
    """On PostgreSQL, the sweep escalates while dave's decision on the approval he claimed
    commits: it waits for the decision, finds the approval closed and skips it, so a decided
    approval is never escalated and its assignment still shows who held it when decided."""
    async with sql_store("postgres") as store:
        ctx = await paused(store)
        agent = ctx.app.banking_agent
        await claim(agent, ctx.approval, DAVE)  # a stored row, as in the test above
        url = store.url.render_as_string(hide_password=False)
        with psycopg.connect(libpq_dsn(store.url), autocommit=True) as admin:
            admin.execute(SLOW_DECISION_COMMIT)
        decision = asyncio.ensure_future(
            decide(agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
        )
        try:
            await wait_until_a_commit_sleeps(url)
            report = await sweep_assignments(ctx.app.ai, store, now=ctx.at(61))
            outcome = await decision
        finally:
            decision.cancel()
        assert report.escalated == [], "an approval decided meanwhile was escalated"
        assert outcome.is_decided and outcome.decided.decided_by == "dave"
        held = await ctx.assignment()
        assert (held.assignee, held.group, held.escalated_at) == ("dave", "payments", None)
        assert await ctx.turn_status() == (TurnStatus.COMPLETED, FinishReason.STOP)
        assert len(ctx.app.transfers) == 1
