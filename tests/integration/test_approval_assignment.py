"""Assignment, escalation and reminders of approvals (engine.assignment) on every store: who
may claim, assign, release and decide; an overdue approval escalating once without being
decided; reminders once per interval; two sweeps at once on PostgreSQL escalating once.

The concurrent sweep test makes the race wide on PostgreSQL: a deferred constraint trigger,
created only in the test's own database, sleeps at the commit of an escalation, and the second
sweep runs meanwhile. Without the guard on ``escalated_at`` (``stores/assignments.py``), the
second sweep would escalate again once the first commits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
import pytest

from engine.approval_policy import ApprovalRefusedError
from engine.assignment import (
    ApprovalClaimedError,
    Assignment,
    AssignmentBook,
    assign,
    claim,
    current_assignment,
    release,
    sweep_assignments,
)
from engine.errors import ApprovalNotPendingError
from engine.expiry import expire_approvals
from engine.inbox import Decision, decide, find_approval
from engine.parts import Message
from engine.remote.auth import Principal
from engine.status import FinishReason, TurnStatus
from engine.store import PendingApproval, SessionStore, TurnInput
from engine.turn_request import TurnRequest
from examples.banking import BankingApp, build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, sql_store
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


async def paused(store: SessionStore, *, escalate: bool = True, remind: bool = False) -> Paused:
    """alice asks for a transfer; the turn pauses at userApproval, assigned to payments."""
    app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
    interrupt = app.user_approval
    interrupt.group = "payments"
    if escalate:
        interrupt.timeout, interrupt.escalate_to = 60.0, "leads"
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
    assert isinstance(store, AssignmentBook)
    assert key in await store.get_assignments([key])
    await store.prune_sessions(settled_before=ctx.at(3600))
    assert await store.get_assignments([key]) == {}


async def wait_until_an_escalation_sleeps(url: str, timeout: float = 10.0) -> None:
    """Return once a backend of this database sleeps in the escalation's commit."""
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
    raise AssertionError("the first escalation never started sleeping in its commit")


async def test_two_sweeps_at_once_escalate_once() -> None:
    """Two stores on one PostgreSQL database (two worker processes) sweep at once: the second
    runs while the first's escalation commits, waits for it, and escalates nothing."""
    async with sql_store("postgres") as first:
        ctx = await paused(first)
        url = first.url.render_as_string(hide_password=False)
        with psycopg.connect(libpq_dsn(first.url), autocommit=True) as admin:
            admin.execute(SLOW_ESCALATION_COMMIT)
        second_app = build(
            store=(second := SqlSessionStore(url)), state_keys=TEST_STATE_KEYS, execution="inline"
        )
        second_app.user_approval.group = "payments"
        second_app.user_approval.timeout, second_app.user_approval.escalate_to = 60.0, "leads"
        try:
            slow = asyncio.ensure_future(sweep_assignments(ctx.app.ai, first, now=ctx.at(61)))
            await wait_until_an_escalation_sleeps(url)
            other = await sweep_assignments(second_app.ai, second, now=ctx.at(61))
            first_report = await slow
        finally:
            await second.close()
        assert len(first_report.escalated) + len(other.escalated) == 1
        assert len(first_report.escalated) == 1, "the sweep that slept escalated it"
        moved = await ctx.assignment()
        assert (moved.group, moved.escalated_from_group) == ("leads", "payments")


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
