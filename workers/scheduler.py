"""Periodic maintenance jobs of one worker process, run by APScheduler 3.x.

Each worker process runs its own :class:`AsyncIOScheduler` with the default in-memory job
store: APScheduler's job store is never shared between processes (its 3.x FAQ: "You can't"),
so every process schedules the same jobs and the jobs themselves are idempotent guarded SQL.
A job that should run once per cluster additionally holds the store's cluster lock (an
advisory lock on PostgreSQL; the in-memory store, of one process, always gets it).

Jobs: the expiry of long-lived approvals (:func:`engine.approvals.expiry.expire_approvals`), which
the store already guards — running it on every worker at once decides each approval once — with the
escalations and reminders of open approvals (:func:`engine.approvals.assignment.sweep_assignments`,
guarded the same way), and, when a retention period is set, the pruning of sessions idle for longer
than it (:meth:`engine.store.SessionStore.prune_sessions`, batched, under its own cluster lock),
and, when the engine configures webhooks, their delivery from the outbox
(:class:`workers.webhooks.WebhookDeliverer`, leased per delivery, on every worker).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler  # type: ignore[import-untyped]

from engine import Engine
from engine.approvals.assignment import sweep_assignments
from engine.approvals.expiry import expire_approvals
from engine.store import SessionStore
from workers.webhooks import WebhookDeliverer

__all__ = ["EXPIRY_LOCK", "RETENTION_LOCK", "MaintenanceScheduler"]

logger = logging.getLogger("turnstile.worker.scheduler")

#: Name of the cluster lock the expiry job takes.
EXPIRY_LOCK = "turnstile.expire_approvals"
#: Name of the cluster lock the retention job takes.
RETENTION_LOCK = "turnstile.prune_sessions"
#: Sessions deleted per transaction by the retention job (short transactions, small locks).
RETENTION_BATCH = 500


class MaintenanceScheduler:
    """The worker process's APScheduler: an interval job expiring overdue approvals, and one
    pruning sessions idle for longer than ``retention`` seconds (when given).

    ``start()`` must be called from inside the running event loop (APScheduler binds to it);
    ``shutdown(grace)`` stops scheduling and cancels a job still running after ``grace``.
    """

    def __init__(
        self,
        engine: Engine,
        store: SessionStore,
        *,
        expiry_interval: float,
        retention: float | None = None,
        retention_interval: float = 300.0,
        webhook_interval: float = 1.0,
    ) -> None:
        if expiry_interval <= 0:
            raise ValueError("expiry_interval must be positive.")
        if retention is not None and retention <= 0:
            raise ValueError("retention must be positive (seconds), or None to keep everything.")
        if retention_interval <= 0:
            raise ValueError("retention_interval must be positive.")
        self.retention = retention
        self.retention_interval = retention_interval
        #: Sessions the retention job deleted in this process.
        self.pruned_total = 0
        self.engine = engine
        self.store = store
        self.expiry_interval = expiry_interval
        #: How many times the expiry job ran to the end (with or without work to do).
        self.expiry_runs = 0
        # A fixed UTC timezone: APScheduler would otherwise look up the host's local zone,
        # which is irrelevant to interval jobs and can fail on minimal containers.
        self._scheduler: Any = AsyncIOScheduler(timezone=UTC)
        self._current: asyncio.Task[Any] | None = None  # the job run in progress, if any
        #: Delivers the webhook outbox, when the engine configures any webhook.
        self.webhooks = WebhookDeliverer(engine, store) if engine.webhooks.any else None
        self.webhook_interval = webhook_interval

    @property
    def running(self) -> bool:
        """Whether the scheduler has been started and not shut down."""
        return bool(self._scheduler.running)

    def start(self) -> None:
        """Schedule the jobs and start the scheduler on the running event loop."""
        asyncio.get_running_loop()  # fail early and clearly outside a loop
        self._every(self.expiry_interval, self.run_expiry, "expire_approvals", "expire approvals")
        if self.retention is not None:
            self._every(self.retention_interval, self.run_retention, "prune_sessions", "retention")
        if self.webhooks is not None:
            self._every(self.webhook_interval, self.run_webhooks, "deliver_webhooks", "webhooks")
        self._scheduler.start()

    def _every(
        self, seconds: float, job: Callable[[], Awaitable[None]], job_id: str, name: str
    ) -> None:
        self._scheduler.add_job(
            job,
            "interval",
            seconds=seconds,
            id=job_id,
            name=name,
            # One run at a time, and runs missed while the loop was busy collapse into one:
            # each job catches up on everything due anyway.
            coalesce=True,
            max_instances=1,
            misfire_grace_time=max(1, math.ceil(seconds)),
            replace_existing=True,
        )

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop scheduling, give a job still running up to ``grace`` seconds, then cancel
        it; safe to call twice."""
        if not self._scheduler.running:
            return
        # Pause first so no new run starts, then let a running one finish: cancelling it is
        # harmless (the job is idempotent) but APScheduler would log it as a job error.
        self._scheduler.pause()
        if self._current is not None and not self._current.done() and grace > 0:
            await asyncio.wait({self._current}, timeout=grace)
        self._scheduler.shutdown(wait=False)
        # AsyncIOScheduler.shutdown only queues the real shutdown on the loop
        # (call_soon_threadsafe): yield once so it runs before our caller moves on.
        await asyncio.sleep(0)
        if self.webhooks is not None:
            await self.webhooks.aclose()

    async def run_expiry(self) -> None:
        """One run of the expiry job; never raises (a failure is logged and retried next
        interval, because the database may be restarting)."""
        if await self._run_locked(EXPIRY_LOCK, self._expire, self.expiry_interval):
            self.expiry_runs += 1

    async def run_retention(self) -> None:
        """One run of the retention job: delete idle sessions in batches until none is left;
        never raises (a failure is logged and retried next interval)."""
        if self.retention is not None:
            await self._run_locked(RETENTION_LOCK, self._prune, self.retention_interval)

    async def run_webhooks(self) -> None:
        """One run of the webhook job on this worker (no cluster lock: deliveries are
        leased one by one, so workers share the outbox); never raises (a failure is logged
        and the job runs again next interval)."""
        if self.webhooks is None:
            return
        self._current = asyncio.current_task()
        try:
            await self.webhooks.run_once()
        except Exception:
            logger.exception("webhooks failed; will retry in %.1fs", self.webhook_interval)

    async def _run_locked(
        self, lock_name: str, work: Callable[[], Awaitable[None]], interval: float
    ) -> bool:
        """Run ``work`` under the store's cluster lock ``lock_name`` (if it offers one);
        ``False`` when another worker holds the lock or the run failed (logged)."""
        self._current = asyncio.current_task()  # what shutdown() gives its grace to
        try:
            async with self.store.try_cluster_lock(lock_name) as acquired:
                if not acquired:
                    logger.debug("%s: another worker holds the lock; skipping", lock_name)
                    return False
                await work()
                return True
        except Exception:
            logger.exception("%s failed; will retry in %.1fs", lock_name, interval)
            return False

    async def _expire(self) -> None:
        created = await expire_approvals(self.engine, self.store)
        if created:
            logger.info("expiry: decided %d overdue approval(s): %s", len(created), created)
        # Escalations and reminders are guarded per approval in the store, like expiry.
        await sweep_assignments(self.engine, self.store)

    async def _prune(self) -> None:
        assert self.retention is not None
        cutoff = datetime.now(UTC) - timedelta(seconds=self.retention)
        while True:
            deleted = await self.store.prune_sessions(settled_before=cutoff, limit=RETENTION_BATCH)
            self.pruned_total += deleted
            if deleted:
                logger.info("retention: deleted %d session(s) idle since %s", deleted, cutoff)
            if deleted < RETENTION_BATCH:
                return
