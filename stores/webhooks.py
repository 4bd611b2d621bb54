"""SQL for the outbox of outgoing webhooks (``webhook_deliveries``, migration 0014; the rules
are :mod:`engine.approvals.webhooks`'s).

A delivery is inserted with ``ON CONFLICT DO NOTHING`` on its id (derived from the event and
the endpoint), so the same event written by a decision and by the ``opened`` sweep, or by two
workers at once, is kept once. A worker claims due deliveries in one ``UPDATE`` over a
``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL (two workers skip each other's rows;
SQLite has one writer at a time), setting a lease token and expiry and counting the attempt;
it then posts outside any transaction and settles the delivery with an ``UPDATE`` guarded by
its token, so a worker whose lease expired and was taken over writes nothing. A delivery queued
and each attempt's outcome are entries of its turn's history, appended in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from engine.store import PendingApproval, WebhookDelivery, WebhookSettlement
from engine.store.history import delivery_entry, settlement_entry
from engine.store.rules import settled_fields
from stores.approval_rows import pending_approval, select_pending
from stores.database import record_from_row, utc
from stores.history import append_history
from stores.schema import approval_queue, webhook_deliveries

__all__ = [
    "add_deliveries",
    "claim_deliveries",
    "count_pending",
    "list_deliveries",
    "list_unannounced",
    "opened_watermark",
    "settle_delivery",
]

_STORED = [c.name for c in webhook_deliveries.columns]


def add_deliveries(connection: Connection, deliveries: Sequence[WebhookDelivery]) -> int:
    """Insert ``deliveries``, skipping any whose id is kept already; how many were new."""
    if not deliveries:
        return 0
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    rows = [d.model_dump(include=set(_STORED)) for d in deliveries]
    for row in rows:
        row["next_attempt_at"] = row["next_attempt_at"] or row["occurred_at"]
    added = connection.execute(
        dialect.insert(webhook_deliveries)
        .values(rows)
        .on_conflict_do_nothing(index_elements=["id"])
        .returning(*webhook_deliveries.columns)
    ).all()
    for added_row in added:
        delivery = record_from_row(WebhookDelivery, added_row)
        append_history(
            connection, delivery.turn_id, delivery_entry(delivery, "queued", delivery.occurred_at)
        )
    return len(added)


def opened_watermark(connection: Connection) -> datetime | None:
    """The newest ``occurred_at`` of an ``opened`` delivery (along its partial index)."""
    w = webhook_deliveries.c
    latest = connection.execute(
        sa.select(sa.func.max(w.occurred_at)).where(w.event == "opened")
    ).scalar()
    moment: datetime | None = utc(latest)
    return moment


def list_unannounced(
    connection: Connection,
    interrupts: Collection[tuple[str, str]],
    since: datetime | None,
    limit: int,
) -> list[PendingApproval]:
    """See :meth:`engine.store.WebhookOutbox.list_unannounced`."""
    if not interrupts:
        return []
    q = approval_queue.c
    w = webhook_deliveries.c
    announced = sa.exists().where(
        w.turn_id == q.turn_id, w.round == q.round, w.ref == q.ref, w.event == "opened"
    )
    conditions: list[sa.ColumnElement[bool]] = [
        q.decided_at.is_(None),
        sa.or_(*(sa.and_(q.agent == agent, q.name == name) for agent, name in interrupts)),
        ~announced,
    ]
    if since is not None:
        conditions.append(q.created_at >= since)
    rows = connection.execute(
        select_pending(approval_queue)
        .where(*conditions)
        .order_by(q.created_at, q.turn_id, q.ref)
        .limit(limit)
    ).all()
    return [pending_approval(r) for r in rows]


def claim_deliveries(
    connection: Connection,
    *,
    urls: Collection[str],
    lease_token: str,
    lease_seconds: float,
    limit: int,
    now: datetime,
) -> list[WebhookDelivery]:
    """See :meth:`engine.store.WebhookOutbox.claim_deliveries`."""
    if not urls:
        return []
    w = webhook_deliveries.c
    due = (
        sa.select(w.id)
        .where(
            w.status == "pending",
            w.next_attempt_at <= now,
            w.url.in_(list(urls)),
            sa.or_(w.lease_expires_at.is_(None), w.lease_expires_at <= now),
        )
        .order_by(w.next_attempt_at, w.occurred_at, w.id)
        .limit(limit)
    )
    if connection.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    rows = connection.execute(
        sa.update(webhook_deliveries)
        .where(w.id.in_(due.scalar_subquery()))
        .values(
            lease_token=lease_token,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            attempts=w.attempts + 1,
        )
        .returning(*webhook_deliveries.columns)
    ).all()
    claimed = [record_from_row(WebhookDelivery, r) for r in rows]
    return sorted(claimed, key=lambda d: (d.next_attempt_at or d.occurred_at, d.occurred_at))


def settle_delivery(connection: Connection, settlement: WebhookSettlement) -> bool:
    """See :meth:`engine.store.WebhookOutbox.settle_delivery`."""
    w = webhook_deliveries.c
    row = connection.execute(
        sa.update(webhook_deliveries)
        .where(
            w.id == settlement.id,
            w.lease_token == settlement.lease_token,
            w.status == "pending",
        )
        .values(**settled_fields(settlement))
        .returning(*webhook_deliveries.columns)
    ).first()
    if row is None:
        return False
    delivery = record_from_row(WebhookDelivery, row)
    append_history(connection, delivery.turn_id, settlement_entry(delivery, settlement))
    return True


def list_deliveries(
    connection: Connection, *, turn_id: str | None, status: str | None, limit: int
) -> list[WebhookDelivery]:
    """See :meth:`engine.store.WebhookOutbox.list_deliveries`."""
    w = webhook_deliveries.c
    conditions: list[sa.ColumnElement[bool]] = []
    if turn_id is not None:
        conditions.append(w.turn_id == turn_id)
    if status is not None:
        conditions.append(w.status == status)
    rows = connection.execute(
        sa.select(webhook_deliveries)
        .where(*conditions)
        .order_by(w.occurred_at, w.event_id, w.url)
        .limit(limit)
    ).all()
    return [record_from_row(WebhookDelivery, r) for r in rows]


def count_pending(connection: Connection) -> int:
    """Deliveries not yet delivered nor given up (the pending gauge)."""
    w = webhook_deliveries.c
    count: int = connection.execute(
        sa.select(sa.func.count()).select_from(webhook_deliveries).where(w.status == "pending")
    ).scalar_one()
    return count
