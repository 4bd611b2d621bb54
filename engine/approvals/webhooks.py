"""Outgoing webhooks about approvals: opened, reminded, escalated and decided.

A :class:`Webhook` (a URL, a secret, the events it wants, a body format) is configured on an
interrupt (``define_interrupt(..., webhooks=[...])``), on a tool that pauses for approval
(``define_tool(..., webhooks=[...])``) or per group on the engine
(``Engine(webhooks={"managers": [...]})``): an event goes to the webhooks of the approval's
interrupt and to those of the group the approval is assigned to at that moment (for an
escalation, the group it moves to), each endpoint once.

Delivery is at least once, from a durable outbox (:class:`~engine.store.WebhookOutbox`):

* **decided**, **escalated**, **reminded**: the deliveries ride on the change itself
  (``ApprovalChange.deliveries``, ``AssignmentChange.deliveries``) and are written in its
  transaction, so a change that rolls back leaves none and one that commits cannot lose
  them. They carry the approval's ``opened`` delivery too (kept once by its id), so a
  receiver hears of an approval before its decision however fast it was decided.
* **opened**: announced by the worker's sweep (:func:`announce_opened`), which finds the
  open approvals of interrupts with webhooks that have no ``opened`` delivery yet, from a
  watermark (the newest announced approval's creation, less :data:`OPENED_SLACK` for pauses
  committed late). The pause that opens an approval is a turn's own transaction: writing
  nothing there keeps a workflow's commits and its turn's path unchanged, at the price of an
  ``opened`` event arriving within one sweep interval rather than at once.

A worker delivers (``workers/webhooks.py``): it leases due deliveries, posts each outside any
transaction, and records the outcome under its lease; a failure is retried after
:func:`engine.webhooks.backoff_delay` until ``MAX_ATTEMPTS``, then marked ``failed``.
Nothing here runs on a turn's path, so a receiver that is down never blocks or fails a turn.

The endpoints, their signing and bodies are :mod:`engine.webhooks`'s (docs/webhooks.md).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from engine.store import (
    ApprovalChange,
    OpenApproval,
    PendingApproval,
    SessionStore,
    WebhookDelivery,
    WebhookEvent,
)
from engine.store.port import ApprovalRule
from engine.webhooks import Webhook, WebhookRoutes, render_body

if TYPE_CHECKING:
    from engine.agent import Agent
    from engine.engine import Engine
    from engine.tools import Tool

__all__ = [
    "OPENED_SLACK",
    "announce_opened",
    "announcing_decision",
    "change_deliveries",
    "deliveries_for",
    "opened_interrupts",
]

logger = logging.getLogger("turnstile.webhooks")

#: How far before the watermark the ``opened`` sweep looks again: a pause's transaction may
#: commit after a later-created approval was already announced.
OPENED_SLACK = timedelta(minutes=2)


@dataclass(frozen=True)
class _Event:
    """One event about one approval, before it is rendered for an endpoint."""

    event: WebhookEvent
    approval: PendingApproval
    occurred_at: datetime
    group: str | None = None
    assignee: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def approval_id(self) -> str:
        return f"{self.approval.turn_id}:{self.approval.ref}"

    @property
    def event_id(self) -> str:
        # A reminder happens once per interval, every other event once per approval.
        suffix = f"/{self.occurred_at.isoformat()}" if self.event == "reminded" else ""
        return f"{self.approval_id}/{self.event}{suffix}"

    def payload(self) -> dict[str, Any]:
        a = self.approval
        return {
            "event": self.event,
            "event_id": self.event_id,
            "occurred_at": self.occurred_at.isoformat(),
            "approval_id": self.approval_id,
            "turn_id": a.turn_id,
            "session_id": a.session_id,
            "agent": a.agent,
            "interrupt": a.interrupt,
            "ref": a.ref,
            "round": a.round,
            "requested_by": a.owner,
            "input": a.input,
            "opened_at": a.created_at.isoformat(),
            "group": self.group,
            "assignee": self.assignee,
            **self.details,
        }


def _delivery(event: _Event, hook: Webhook) -> WebhookDelivery:
    digest = hashlib.sha256(f"{event.event_id}\n{hook.url}".encode()).hexdigest()
    a = event.approval
    return WebhookDelivery(
        id=digest[:32],
        event_id=event.event_id,
        event=event.event,
        turn_id=a.turn_id,
        round=a.round,
        ref=a.ref,
        url=hook.url,
        body=render_body(hook.format, event.payload()),
        occurred_at=event.occurred_at,
        next_attempt_at=event.occurred_at,
    )


def deliveries_for(
    routes: WebhookRoutes,
    tool: Tool | None,
    approval: PendingApproval,
    event: WebhookEvent,
    *,
    occurred_at: datetime,
    group: str | None = None,
    assignee: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> tuple[WebhookDelivery, ...]:
    """The outbox rows of ``event`` about ``approval`` (assigned to ``group``), one per
    endpoint that wants it; none when no webhook does."""
    hooks = routes.endpoints(getattr(tool, "webhooks", ()), group, event)
    if not hooks:
        return ()
    happened = _Event(event, approval, occurred_at, group, assignee, details or {})
    return tuple(_delivery(happened, hook) for hook in hooks)


def _opened(
    routes: WebhookRoutes, tool: Tool | None, approval: PendingApproval
) -> tuple[WebhookDelivery, ...]:
    group = getattr(tool, "group", None)
    return deliveries_for(
        routes, tool, approval, "opened", occurred_at=approval.created_at, group=group
    )


def with_opened(
    routes: WebhookRoutes,
    tool: Tool | None,
    approval: PendingApproval,
    later: tuple[WebhookDelivery, ...],
) -> tuple[WebhookDelivery, ...]:
    """``later`` preceded by the approval's ``opened`` deliveries, when ``later`` has any:
    written together, a receiver hears of the approval before what happened to it."""
    return (*_opened(routes, tool, approval), *later) if later else ()


def change_deliveries(
    agent: Agent,
    approval: PendingApproval,
    event: WebhookEvent,
    *,
    at: datetime,
    group: str | None,
    assignee: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> tuple[WebhookDelivery, ...]:
    """The deliveries an escalation or a reminder of ``approval`` carries (with its
    ``opened`` ones): to its interrupt's webhooks and ``group``'s."""
    tool = agent.tools.get(approval.interrupt)
    found = deliveries_for(
        agent.webhooks,
        tool,
        approval,
        event,
        occurred_at=at,
        group=group,
        assignee=assignee,
        details=details,
    )
    return with_opened(agent.webhooks, tool, approval, found)


def announcing_decision(
    agent: Agent, approval: PendingApproval, rule: ApprovalRule
) -> ApprovalRule:
    """``rule``, whose decision also queues the ``decided`` deliveries (to the approval's
    interrupt and its group as the store read it under the decision's lock)."""
    routes = agent.webhooks
    tool = agent.tools.get(approval.interrupt)
    if not routes.any:
        return rule

    def announcing(open_approval: OpenApproval) -> ApprovalChange:
        change = rule(open_approval)
        if not change.decides:
            return change
        stored = open_approval.assignment
        group = stored.group if stored is not None else getattr(tool, "group", None)
        decided = deliveries_for(
            routes,
            tool,
            approval,
            "decided",
            occurred_at=open_approval.now,
            group=group,
            assignee=stored.assignee if stored is not None else None,
            details={"decided_by": change.decided_by, "answer": change.answer},
        )
        return replace(change, deliveries=with_opened(routes, tool, approval, decided))

    return announcing


def opened_interrupts(engine: Engine, store: SessionStore) -> list[tuple[str, str]]:
    """The ``(agent, interrupt)`` pairs of ``store`` whose approvals someone hears opened."""
    pairs: list[tuple[str, str]] = []
    for agent in engine.agents.values():
        if agent.store is not store:
            continue
        for tool in agent.tools.values():
            if engine.webhooks.endpoints(tool.webhooks, getattr(tool, "group", None), "opened"):
                pairs.append((agent.name, tool.name))
    return pairs


async def announce_opened(engine: Engine, store: SessionStore, *, limit: int = 200) -> int:
    """Queue the ``opened`` deliveries of approvals opened since the watermark (see the
    module); how many deliveries were new. Safe on several workers at once: a delivery is
    kept once by its id."""
    pairs = opened_interrupts(engine, store)
    if not pairs:
        return 0
    watermark = await store.opened_watermark()
    since = watermark - OPENED_SLACK if watermark is not None else None
    fresh = await store.list_unannounced(pairs, since=since, limit=limit)
    rows: list[WebhookDelivery] = []
    for approval in fresh:
        agent = engine.agents.get(approval.agent)
        tool = agent.tools.get(approval.interrupt) if agent is not None else None
        rows.extend(_opened(engine.webhooks, tool, approval))
    added = await store.add_deliveries(rows) if rows else 0
    if added:
        logger.info("webhooks: queued %d opened deliveries", added)
    return added
