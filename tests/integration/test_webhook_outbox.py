"""The webhook outbox on every store (engine.approvals.webhooks, stores/webhooks.py): a decision,
an escalation and a reminder queue their deliveries in their own transaction, once; the sweep
announces each opened approval once; a claim leases each delivery to one worker; and the
worker's delivery against a real receiver records retries, gives up after its last attempt,
and delivers signed once the receiver answers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest

from engine.approvals.assignment import sweep_assignments
from engine.approvals.decide import Decision, decide, find_approval
from engine.approvals.rules import decision_rule
from engine.approvals.webhooks import announce_opened, announcing_decision
from engine.remote.auth import Principal
from engine.store import (
    ApprovalChange,
    OpenApproval,
    PendingApproval,
    SessionStore,
    WebhookDelivery,
    WebhookSettlement,
)
from engine.webhooks import Webhook
from examples.banking import BankingApp
from tests.integration.guarded_support import BOB
from tests.integration.guarded_support import paused as paused_tool
from tests.integration.test_approval_assignment import Paused, paused
from tests.webhook_receiver import receiving
from workers.webhooks import WebhookDeliverer

SECRET = "whsec-integration-0123456789"
#: The endpoints :func:`hooked` configures.
URLS = ("http://127.0.0.1:9/own", "http://127.0.0.1:9/payments")
DAVE = Principal("dave", roles=frozenset({"payments"}))
APPROVE = Decision(respond={"approved": True})


@dataclass
class Hooked:
    """An approval paused as :func:`paused` leaves it (group ``payments``, reminded every
    minute), whose interrupt has a webhook ``own`` and whose group another, ``team``."""

    paused: Paused
    own: Webhook
    team: Webhook

    @property
    def app(self) -> BankingApp:
        return self.paused.app

    @property
    def approval(self) -> PendingApproval:
        return self.paused.approval

    def at(self, seconds: float) -> datetime:
        return self.paused.at(seconds)

    async def deliveries(self) -> list[WebhookDelivery]:
        return await self.paused.store.list_deliveries(turn_id=self.approval.turn_id)


async def hooked(
    store: SessionStore, *, url: str = "http://127.0.0.1:9/own", escalate: bool = False
) -> Hooked:
    """alice's transfer paused at its approval, then webhooks configured (the pause writes
    nothing for them, so configuring them afterwards is the same)."""
    ctx = await paused(store, escalate=escalate, remind=True)
    own = Webhook(url=url, secret=SECRET)
    team = Webhook(url="http://127.0.0.1:9/payments", secret=SECRET)
    routes = ctx.app.ai.webhooks
    routes.groups["payments"] = routes.add([team])
    ctx.app.user_approval.webhooks = routes.add([own])
    return Hooked(paused=ctx, own=own, team=team)


def summary(deliveries: list[WebhookDelivery]) -> list[tuple[str, str]]:
    return sorted((d.event, d.url.rsplit("/", 1)[1]) for d in deliveries)


async def test_a_decision_queues_its_deliveries_with_its_opened_ones(store: SessionStore) -> None:
    """Deciding queues ``decided`` for the interrupt's and the group's webhooks, preceded by
    ``opened`` (the sweep had not announced it yet), each once, pending and due."""
    ctx = await hooked(store)
    assert await ctx.deliveries() == []  # the pause itself writes nothing
    outcome = await decide(
        ctx.app.banking_agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE
    )
    assert outcome.is_decided
    queued = await ctx.deliveries()
    assert summary(queued) == [
        ("decided", "own"),
        ("decided", "payments"),
        ("opened", "own"),
        ("opened", "payments"),
    ]
    assert all(d.status == "pending" and d.attempts == 0 for d in queued)
    decided = next(d for d in queued if d.event == "decided")
    assert decided.event_id == f"{ctx.approval.turn_id}:approval-1/decided"
    assert '"decided_by": "dave"' in decided.body
    opened = next(d for d in queued if d.event == "opened")
    assert opened.occurred_at == ctx.approval.created_at
    # The sweep finds nothing left to announce: the decision's opened rows stand.
    assert await announce_opened(ctx.app.ai, store) == 0


async def test_a_decision_that_rolls_back_leaves_no_delivery(store: SessionStore) -> None:
    """A decision whose transaction fails (here: one of its outbox rows names no approval)
    records neither the decision nor any of its deliveries."""
    if not store.durable:
        pytest.skip("the in-memory store has no transaction to roll back")
    ctx = await hooked(store)
    rule = announcing_decision(
        ctx.app.banking_agent,
        ctx.approval,
        decision_rule({"respond": {"approved": True}}, decided_by="dave"),
    )

    def breaking(open_approval: OpenApproval) -> ApprovalChange:
        change = rule(open_approval)
        stray = change.deliveries[0].model_copy(update={"id": "stray", "turn_id": "no-such-turn"})
        return replace(change, deliveries=(*change.deliveries, stray))

    with pytest.raises(Exception):  # noqa: B017 (the database's own integrity error)
        await store.change_approval(ctx.approval.turn_id, 1, "approval-1", breaking)
    assert await ctx.deliveries() == []
    still = await find_approval(store, ctx.approval.turn_id, "approval-1")
    assert still is not None and still[1], "the decision rolled back with its deliveries"


async def test_escalation_and_reminders_queue_their_deliveries_once(store: SessionStore) -> None:
    """An escalation tells the interrupt's webhooks (not payments', which it leaves); a
    reminder tells the group holding the approval; a second sweep in the same interval
    queues nothing more."""
    ctx = await hooked(store, escalate=True)
    leads = Webhook(url="http://127.0.0.1:9/leads", secret=SECRET)
    ctx.app.ai.webhooks.groups["leads"] = ctx.app.ai.webhooks.add([leads])
    report = await sweep_assignments(ctx.app.ai, store, now=ctx.at(61))
    assert len(report.escalated) == 1 and len(report.reminded) == 1
    assert summary(await ctx.deliveries()) == [
        ("escalated", "leads"),
        ("escalated", "own"),
        ("opened", "own"),
        ("opened", "payments"),
        ("reminded", "leads"),
        ("reminded", "own"),
    ]
    again = await sweep_assignments(ctx.app.ai, store, now=ctx.at(62))
    assert again.escalated == [] and again.reminded == []
    assert len(await ctx.deliveries()) == 6
    await sweep_assignments(ctx.app.ai, store, now=ctx.at(122))
    reminders = [d for d in await ctx.deliveries() if d.event == "reminded"]
    assert len({d.event_id for d in reminders}) == 2, "each reminder is its own event"


async def test_the_sweep_announces_each_opened_approval_once(store: SessionStore) -> None:
    """The opened sweep queues an open approval's ``opened`` deliveries once, however often
    it runs."""
    ctx = await hooked(store)
    assert await announce_opened(ctx.app.ai, store) == 2
    assert await announce_opened(ctx.app.ai, store) == 0
    assert summary(await ctx.deliveries()) == [("opened", "own"), ("opened", "payments")]
    assert await store.opened_watermark() == ctx.approval.created_at


async def test_a_claim_leases_each_delivery_to_one_claimer(store: SessionStore) -> None:
    """A claimer gets only deliveries to endpoints it knows; two claims at once share no
    delivery; a leased delivery is not claimed again until its lease expires; an outcome is
    written only under the lease that claimed it."""
    ctx = await hooked(store)
    await announce_opened(ctx.app.ai, store)
    elsewhere = ["http://127.0.0.1:9/another-apps"]
    assert (
        await store.claim_deliveries(urls=elsewhere, lease_token="x", lease_seconds=60, limit=9)
        == []
    )
    first, second = await asyncio.gather(
        store.claim_deliveries(urls=URLS, lease_token="a", lease_seconds=60, limit=1),
        store.claim_deliveries(urls=URLS, lease_token="b", lease_seconds=60, limit=1),
    )
    assert len(first) == len(second) == 1
    assert first[0].id != second[0].id
    assert first[0].attempts == 1 and first[0].lease_token == "a"
    assert (
        await store.claim_deliveries(urls=URLS, lease_token="c", lease_seconds=60, limit=10) == []
    )

    now = datetime.now(UTC)
    stolen = WebhookSettlement(id=first[0].id, lease_token="b", outcome="delivered", at=now)
    assert not await store.settle_delivery(stolen)
    retry = WebhookSettlement(
        id=first[0].id,
        lease_token="a",
        outcome="retry",
        error="HTTP 503",
        retry_at=now + timedelta(hours=1),
        at=now,
    )
    assert await store.settle_delivery(retry)
    assert (
        await store.claim_deliveries(urls=URLS, lease_token="d", lease_seconds=60, limit=10) == []
    )

    # b's worker is gone: once its lease expires the delivery is claimed again.
    await store.settle_delivery(
        WebhookSettlement(
            id=second[0].id,
            lease_token="b",
            outcome="retry",
            retry_at=now - timedelta(seconds=1),
            at=now,
        )
    )
    taken = await store.claim_deliveries(urls=URLS, lease_token="e", lease_seconds=0, limit=10)
    assert [d.id for d in taken] == [second[0].id]
    again = await store.claim_deliveries(urls=URLS, lease_token="f", lease_seconds=60, limit=10)
    assert [(d.id, d.attempts) for d in again] == [(second[0].id, 3)]
    kept = {d.id: d for d in await ctx.deliveries()}
    assert kept[first[0].id].last_error == "HTTP 503"
    assert kept[first[0].id].status == "pending"


async def test_delivery_retries_while_the_receiver_fails_then_delivers_signed(
    store: SessionStore,
) -> None:
    """A receiver answering 503 leaves the delivery pending with the attempt and error
    recorded and a later retry time; once it accepts, the next due attempt delivers it, with
    a signature it verifies."""
    with receiving(SECRET) as receiver:
        ctx = await hooked(store, url=receiver.url)
        ctx.app.user_approval.group = None  # only the interrupt's own webhook
        deliverer = WebhookDeliverer(ctx.app.ai, store, backoff_base=2.0)
        try:
            receiver.fail_with = 503
            report = await deliverer.run_once()
            assert (report.opened, report.retried, report.delivered) == (1, 1, 0)
            [pending] = await ctx.deliveries()
            assert (pending.status, pending.attempts, pending.last_error) == (
                "pending",
                1,
                "HTTP 503",
            )
            assert pending.next_attempt_at is not None
            assert pending.next_attempt_at > datetime.now(UTC)
            receiver.fail_with = None
            assert (await deliverer.run_once()).delivered == 0, "not due before its backoff"
            wait = (pending.next_attempt_at - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(max(0.0, wait) + 0.05)
            assert (await deliverer.run_once()).delivered == 1
        finally:
            await deliverer.aclose()
    [done] = await ctx.deliveries()
    assert done.status == "delivered" and done.delivered_at is not None
    assert [r.signed for r in receiver.received] == [True]
    assert receiver.events() == [f"{ctx.approval.turn_id}:approval-1/opened"]
    # The turn's history tells the delivery's story, naming the endpoint by its host alone
    # (the receiver's path, /hooks, is not in it).
    host = urlsplit(receiver.url).netloc
    told = [e.detail for e in await store.timeline(ctx.approval.turn_id) if e.kind == "webhook"]
    assert told == [
        f"opened to {host} queued",
        f"opened to {host} failed, retrying: HTTP 503",
        f"opened to {host} delivered",
    ]


async def test_a_delivery_is_given_up_after_its_last_attempt(store: SessionStore) -> None:
    """With the receiver down, each attempt fails to connect; after ``max_attempts`` the
    delivery is marked failed with the error, and no longer claimed."""
    with receiving(SECRET) as receiver:
        receiver.stop()
        ctx = await hooked(store, url=receiver.url)
        ctx.app.user_approval.group = None
        deliverer = WebhookDeliverer(
            ctx.app.ai, store, max_attempts=2, backoff_base=0.001, backoff_cap=0.001
        )
        try:
            first = await deliverer.run_once()
            await asyncio.sleep(0.01)
            second = await deliverer.run_once()
        finally:
            await deliverer.aclose()
    assert (first.retried, second.failed) == (1, 1)
    [given_up] = await ctx.deliveries()
    assert (given_up.status, given_up.attempts) == ("failed", 2)
    assert given_up.last_error is not None and "Connect" in given_up.last_error
    assert await store.list_deliveries(status="failed") == [given_up]


async def test_retention_takes_a_sessions_deliveries_with_it(store: SessionStore) -> None:
    """Pruning an idle session deletes its approvals' deliveries too (on SQL by the foreign
    key's cascade), so the outbox never outlives the turns it reports."""
    ctx = await hooked(store)
    await decide(ctx.app.banking_agent, ctx.approval, APPROVE, decided_by="dave", approver=DAVE)
    assert len(await ctx.deliveries()) == 4
    pruned = await store.prune_sessions(settled_before=datetime.now(UTC) + timedelta(seconds=1))
    assert pruned == 1
    assert await store.list_deliveries() == []


async def test_a_tool_that_pauses_for_approval_has_webhooks_too(store: SessionStore) -> None:
    """``define_tool(..., webhooks=...)``: the sweep announces the paused call's approval
    opened, and its decision queues ``decided``, like an interrupt's."""
    app, approval = await paused_tool(store)
    hook = Webhook(url="http://127.0.0.1:9/tool", secret=SECRET)
    app.transfer_money.webhooks = app.ai.webhooks.add([hook])
    assert await announce_opened(app.ai, store) == 1
    await decide(app.agent, approval, Decision(restart=True), decided_by="bob", approver=BOB)
    queued = await store.list_deliveries(turn_id=approval.turn_id)
    assert summary(queued) == [("decided", "tool"), ("opened", "tool")]
