"""The lease heartbeat while the store fails: it backs off, reports each outage once, and
the turn still completes once renewals succeed again.

The store is the real in-memory store with one fault injected: its lease renewals fail
during fixed windows of (monotonic) time. The windows are measured by the store itself, so a
heartbeat that never yields to the event loop still sees the outage end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from engine import Engine, TurnStatus
from engine.errors import StoreError
from engine.store import TurnRecord
from engine.store.memory import InMemorySessionStore
from engine.turns.executor import LeaseSettings
from tests.support import ListModel, ask, say

HEARTBEAT_INTERVAL = 0.1
#: Seconds after the turn starts during which every renewal fails.
OUTAGES = ((0.15, 0.55), (0.75, 1.05))
#: How long the turn's one tool call runs: past both outages.
TOOL_SECONDS = 1.3
#: Most failed renewals one outage may see (a heartbeat without backoff makes hundreds).
MAX_FAILURES_PER_OUTAGE = 8

#: How a renewal fails: after a short wait on the "network", at once inside the coroutine,
#: or by raising from the call itself before any coroutine exists.
FAILURE_MODES = ("after-awaiting", "without-awaiting", "synchronously")


class FlakyRenewals(InMemorySessionStore):
    """The in-memory store whose ``renew_lease`` fails during :data:`OUTAGES`."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.started = time.monotonic()
        #: Every renewal attempt: ``(seconds since started, whether it failed)``.
        self.attempts: list[tuple[float, bool]] = []

    def renew_lease(
        self, turn_id: str, *, lease_token: int, lease_seconds: float
    ) -> Coroutine[Any, Any, TurnRecord]:
        """Renew, unless the clock is inside an outage (then fail the way ``mode`` says)."""
        at = time.monotonic() - self.started
        failing = any(start <= at < end for start, end in OUTAGES)
        self.attempts.append((at, failing))
        if not failing:
            return super().renew_lease(
                turn_id, lease_token=lease_token, lease_seconds=lease_seconds
            )
        if self.mode == "synchronously":
            raise StoreError("Database error: connection refused")
        return self._fail(wait=self.mode == "after-awaiting")

    async def _fail(self, *, wait: bool) -> TurnRecord:
        if wait:
            await asyncio.sleep(0.002)
        raise StoreError("Database error: server closed the connection unexpectedly")

    def failures_in(self, outage: tuple[float, float]) -> int:
        """How many renewals failed inside ``outage``."""
        start, end = outage
        return sum(1 for at, failed in self.attempts if failed and start <= at < end)


def slow_turn_agent(store: InMemorySessionStore) -> Any:
    """An agent whose turn is one tool call of :data:`TOOL_SECONDS`, then a final answer."""
    ai = Engine(
        model=ListModel([ask(("work", "w1", {})), say("done")]),
        state_keys={"k": "secret-secret-secret"},
    )

    async def work(_: object) -> dict[str, bool]:
        await asyncio.sleep(TOOL_SECONDS)
        return {"worked": True}

    return ai.define_agent(
        name="slow",
        tools=[ai.define_tool(name="work", fn=work)],
        store=store,
        lease=LeaseSettings(lease_seconds=5.0, heartbeat_interval=HEARTBEAT_INTERVAL),
    )


@pytest.mark.parametrize("mode", FAILURE_MODES)
async def test_failing_renewals_back_off_log_once_per_outage_and_the_turn_completes(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """During two renewal outages the heartbeat makes a bounded number of attempts, logs one
    warning and one recovery per outage without tracebacks, and the turn completes."""
    caplog.set_level(logging.DEBUG, logger="turnstile.executor")
    store = FlakyRenewals(mode)
    agent = slow_turn_agent(store)
    store.started = time.monotonic()

    res = await asyncio.wait_for(agent.chat().send("go"), 10)

    assert res.text == "done"
    snapshot = await agent.get_snapshot(snapshot_id=res.snapshot_id)
    assert snapshot is not None and snapshot.status is TurnStatus.COMPLETED
    for outage in OUTAGES:
        failures = store.failures_in(outage)
        assert 1 <= failures <= MAX_FAILURES_PER_OUTAGE, (outage, store.attempts)
    # Renewals succeeded again after the last outage, before the turn settled.
    assert any(not failed and at >= OUTAGES[-1][1] for at, failed in store.attempts)

    records = [r for r in caplog.records if r.name == "turnstile.executor"]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    recoveries = [r for r in records if r.levelno == logging.INFO and "renewed" in r.message]
    assert len(warnings) == len(OUTAGES), [r.message for r in warnings]
    assert all("renewal" in r.message for r in warnings)
    assert len(recoveries) == len(OUTAGES), [r.message for r in records]
    assert all(r.exc_info is None for r in records)


def test_renewal_retry_delay_doubles_up_to_the_interval_and_stays_inside_the_lease() -> None:
    """The pause after failed renewals doubles from its first value, never exceeds the
    heartbeat interval or half the lease left, and never drops below its first value."""
    lease = LeaseSettings(lease_seconds=30.0, heartbeat_interval=5.0)
    first = lease.renewal_retry_delay
    delays = [lease.retry_delay(failures, lease_left=25.0) for failures in range(1, 12)]
    assert delays[:3] == [first, first * 2, first * 4]
    assert delays == sorted(delays)
    assert delays[-1] == 5.0
    assert lease.retry_delay(20, lease_left=3.0) == 1.5
    assert lease.retry_delay(20, lease_left=0.01) == first
    assert lease.retry_delay(20, lease_left=-1.0) == 5.0
    assert lease.retry_delay(100_000, lease_left=25.0) == 5.0


class FlakyStatusReads(FlakyRenewals):
    """Renewals and the status watch's reads both fail during :data:`OUTAGES`."""

    def __init__(self) -> None:
        super().__init__("after-awaiting")
        self.failed_reads = 0

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        at = time.monotonic() - self.started
        if any(start <= at < end for start, end in OUTAGES):
            self.failed_reads += 1
            raise StoreError("Database error: connection refused")
        return await super().get_turn(turn_id)


async def test_failing_status_checks_log_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    """The abort watch's status reads that fail again and again during an outage log one
    warning for it, without a traceback, not one per attempt."""
    caplog.set_level(logging.DEBUG, logger="turnstile.executor")
    store = FlakyStatusReads()
    agent = slow_turn_agent(store)
    store.started = time.monotonic()

    res = await asyncio.wait_for(agent.chat().send("go"), 10)

    assert res.text == "done"
    status_warnings = [
        r for r in caplog.records if r.name == "turnstile.executor" and "status check" in r.message
    ]
    assert store.failed_reads > len(status_warnings) >= 1, store.failed_reads
    assert len(status_warnings) <= len(OUTAGES)
    assert all(r.exc_info is None for r in status_warnings)
