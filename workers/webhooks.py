"""The worker's delivery of outgoing webhooks from the outbox (:mod:`engine.approvals.webhooks`).

One run (:meth:`WebhookDeliverer.run_once`, a scheduler job of every worker process) queues
the ``opened`` deliveries of newly opened approvals, leases a batch of due deliveries to the
endpoints its app configures (it can sign only for those: secrets are not stored), posts each
one signed — outside any transaction, the lease alone keeping other workers off it — and
records the outcome under the lease: delivered on a 2xx answer; otherwise retried after a
backoff with jitter, or marked ``failed`` after the last attempt.
The deliveries of one approval are posted one after another, oldest event first; different
approvals' in parallel.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import httpx

from engine import Engine
from engine.approvals.webhooks import announce_opened
from engine.store import SessionStore, WebhookDelivery, WebhookSettlement
from engine.telemetry import instruments
from engine.webhooks import MAX_ATTEMPTS, backoff_delay, signed_headers

__all__ = ["DeliveryReport", "WebhookDeliverer"]

logger = logging.getLogger("turnstile.webhooks")

Outcome = Literal["delivered", "retry", "failed"]

#: What an attempt's outcome is counted as (``turnstile_webhook_deliveries{outcome}``).
_COUNTED: dict[str, str] = {"delivered": "delivered", "retry": "retried", "failed": "failed"}


@dataclass
class DeliveryReport:
    """What one run did."""

    opened: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0


class WebhookDeliverer:
    """Delivers the outbox of ``store`` for ``engine``'s webhooks.

    ``batch`` deliveries are leased per run for ``lease_seconds`` (longer than ``timeout``,
    each request's limit, so a lease never runs out under a request still waiting); a
    delivery is given up after ``max_attempts``.
    """

    def __init__(
        self,
        engine: Engine,
        store: SessionStore,
        *,
        batch: int = 50,
        timeout: float = 10.0,
        max_attempts: int = MAX_ATTEMPTS,
        backoff_base: float = 2.0,
        backoff_cap: float = 600.0,
    ) -> None:
        if batch < 1 or timeout <= 0 or max_attempts < 1:
            raise ValueError("batch, timeout and max_attempts must be positive.")
        self.engine = engine
        self.store = store
        self.batch = batch
        self.timeout = timeout
        self.lease_seconds = timeout * 2 + 5
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        # Redirects are not followed: a signed body goes only to the configured URL.
        self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False)

    async def run_once(self) -> DeliveryReport:
        """Queue newly opened approvals' deliveries, then attempt a batch of due ones."""
        report = DeliveryReport(opened=await announce_opened(self.engine, self.store))
        token = uuid.uuid4().hex
        # Only endpoints this app can sign for: during a rolling deploy another version's
        # workers deliver what this one does not know.
        claimed = await self.store.claim_deliveries(
            urls=self.engine.webhooks.urls,
            lease_token=token,
            lease_seconds=self.lease_seconds,
            limit=self.batch,
        )
        by_approval: dict[tuple[str, int, str], list[WebhookDelivery]] = defaultdict(list)
        for delivery in claimed:
            by_approval[(delivery.turn_id, delivery.round, delivery.ref)].append(delivery)
        outcomes = await asyncio.gather(
            *(self._deliver_in_order(group, token) for group in by_approval.values())
        )
        for outcome in (o for group in outcomes for o in group):
            counted = _COUNTED[outcome]
            setattr(report, counted, getattr(report, counted) + 1)
        return report

    async def _deliver_in_order(
        self, deliveries: list[WebhookDelivery], lease_token: str
    ) -> list[str]:
        outcomes: list[str] = []
        for delivery in sorted(deliveries, key=lambda d: d.occurred_at):
            settlement = await self._attempt(delivery, lease_token)
            if await self.store.settle_delivery(settlement):
                instruments.webhook_delivery(_COUNTED[settlement.outcome])
                outcomes.append(settlement.outcome)
            else:
                logger.warning("webhook delivery %s: lease lost, outcome dropped", delivery.id)
        return outcomes

    async def _attempt(self, delivery: WebhookDelivery, lease_token: str) -> WebhookSettlement:
        """Post ``delivery`` once and say what to record."""
        hook = self.engine.webhooks.endpoint(delivery.url)
        error: str | None
        if hook is None:
            error = "the endpoint is no longer configured (no secret to sign with)"
            return self._settle(delivery, lease_token, "failed", error)
        headers = signed_headers(hook.secret, delivery, int(time.time()))
        try:
            response = await self._client.post(
                delivery.url, content=delivery.body.encode(), headers=headers
            )
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            if response.is_success:
                return self._settle(delivery, lease_token, "delivered", None)
            error = f"HTTP {response.status_code}"
        if delivery.attempts >= self.max_attempts:
            logger.error(
                "webhook %s of %s to %s failed after %d attempts: %s",
                delivery.event,
                delivery.event_id,
                delivery.url,
                delivery.attempts,
                error,
            )
            return self._settle(delivery, lease_token, "failed", error)
        logger.info(
            "webhook %s to %s failed (attempt %d): %s",
            delivery.event_id,
            delivery.url,
            delivery.attempts,
            error,
        )
        return self._settle(delivery, lease_token, "retry", error)

    def _settle(
        self, delivery: WebhookDelivery, lease_token: str, outcome: Outcome, error: str | None
    ) -> WebhookSettlement:
        now = datetime.now(UTC)
        delay = backoff_delay(delivery.attempts, base=self.backoff_base, cap=self.backoff_cap)
        return WebhookSettlement(
            id=delivery.id,
            lease_token=lease_token,
            outcome=outcome,
            error=error,
            retry_at=now + timedelta(seconds=delay) if outcome == "retry" else None,
            at=now,
        )

    async def aclose(self) -> None:
        """Close the HTTP client's connections."""
        await self._client.aclose()
