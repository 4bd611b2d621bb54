"""``turnstile webhooks ls``: the outbox of outgoing webhooks, on ``--db`` alone.

What was sent about approvals, what still waits for a retry, and what was given up after its
last attempt (``--status failed``), with the last error (docs/webhooks.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from engine.store import WebhookDelivery
from stores.sql import SqlSessionStore
from workers.cli.operator import OperatorGroup, json_option, limit_option, resolve_id, run_on_store
from workers.cli.output import ago, iso, print_listing
from workers.cli.params import db_option, option

__all__ = ["webhooks"]


@click.group("webhooks", cls=OperatorGroup)
def webhooks() -> None:
    """Outgoing webhooks about approvals: their deliveries."""


def delivery_wire(delivery: WebhookDelivery) -> dict[str, Any]:
    """One delivery as ``webhooks ls --json`` prints it (never its body)."""
    return {
        "id": delivery.id,
        "event": delivery.event,
        "event_id": delivery.event_id,
        "approval_id": f"{delivery.turn_id}:{delivery.ref}",
        "url": delivery.url,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "occurred_at": iso(delivery.occurred_at),
        "next_attempt_at": iso(delivery.next_attempt_at),
        "delivered_at": iso(delivery.delivered_at),
        "last_error": delivery.last_error,
    }


@webhooks.command("ls")
@db_option
@option(
    "--status",
    type=click.Choice(["pending", "delivered", "failed"]),
    default=None,
    help="only deliveries in this status",
)
@option("--turn", default=None, help="only the deliveries of this turn (a unique id prefix)")
@limit_option(50, 1000)
@json_option
def ls(db: str | None, status: str | None, turn: str | None, limit: int, as_json: bool) -> int:
    """List webhook deliveries, oldest event first."""
    now = datetime.now(UTC)

    async def read(store: SqlSessionStore) -> list[WebhookDelivery]:
        turn_id = await resolve_id(store, "turn", turn) or turn if turn is not None else None
        return await store.list_deliveries(turn_id=turn_id, status=status, limit=limit)

    rows = run_on_store(db, read)
    print_listing(
        rows,
        as_json=as_json,
        wire=delivery_wire,
        empty="No webhook deliveries match.",
        columns=["OCCURRED", "EVENT", "APPROVAL", "URL", "STATUS", "ATTEMPTS", "LAST ERROR"],
        cells=lambda d: [
            ago(d.occurred_at, now),
            d.event,
            f"{d.turn_id}:{d.ref}",
            d.url,
            d.status,
            d.attempts,
            d.last_error or "",
        ],
        no_wrap=["APPROVAL"],
    )
    return 0
