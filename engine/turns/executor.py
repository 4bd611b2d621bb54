"""Running a claimed turn: heartbeats, abort, retries and the settling transition.

The same function serves inline execution (a chat without a durable store runs its turn in
the caller's process) and the worker pool: claim, run the :class:`~engine.turns.runner.TurnRunner`
in a task, renew the lease while it runs (the renewal also reads ``aborting``), then settle
through one guarded transition fenced by the lease token. No transaction is held while the
model or a tool runs; every store call is its own short write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.errors import StaleTransitionError
from engine.status import ACTIVE_STATUSES, FinishReason, TurnStatus
from engine.store import ClaimedTurn, FollowOnClaim, SessionStore, Transition, TurnRecord
from engine.store.signals import AbortSignal
from engine.telemetry import instruments, tracing
from engine.turns.runner import ChunkCallback, RunnerConfig, TurnOutcome, TurnRunner

__all__ = ["LeaseSettings", "RetryPolicy", "execute_claimed", "run_inline"]

logger = logging.getLogger("turnstile.executor")

#: The fastest an executor re-reads its turn's status between heartbeats (abort detection),
#: and when it first reads it: an abort from another process stops a turn within this time.
MIN_STATUS_CHECK_INTERVAL = 0.25


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient failures.

    A turn is attempted at most ``max_attempts`` times; attempt *n* waits
    ``initial_delay * multiplier**(n-1)`` seconds (capped at ``max_delay``), scaled by a random
    factor in ``[1 - jitter, 1 + jitter]`` so that retries of many turns spread out.
    """

    max_attempts: int = 3
    initial_delay: float = 0.25
    max_delay: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def delay(self, attempt: int) -> float:
        """Seconds to wait before the attempt after ``attempt`` (1-based)."""
        base = min(self.max_delay, self.initial_delay * self.multiplier ** max(0, attempt - 1))
        return max(0.0, base * random.uniform(1 - self.jitter, 1 + self.jitter))


@dataclass(frozen=True)
class LeaseSettings:
    """How long a claim lasts without renewal, and how often the runner renews it.

    A renewal that fails is retried after :meth:`retry_delay`, starting from
    ``renewal_retry_delay`` seconds.
    """

    lease_seconds: float = 30.0
    heartbeat_interval: float = 5.0
    renewal_retry_delay: float = 0.05

    def retry_delay(self, failures: int, lease_left: float) -> float:
        """Seconds to wait after ``failures`` failed renewals in a row, when the lease
        expires in ``lease_left`` seconds.

        Doubles from ``renewal_retry_delay`` up to ``heartbeat_interval``, and is at most half
        the lease left, so a store that comes back before the lease expires still gets a
        renewal in time; it never drops below ``renewal_retry_delay``, so a store that fails
        at once cannot keep the event loop spinning.
        """
        # The exponent is capped so that a long outage cannot overflow the float.
        delay = self.renewal_retry_delay * 2.0 ** min(max(0, failures - 1), 32)
        delay = min(delay, self.heartbeat_interval)
        if lease_left > 0:
            delay = min(delay, lease_left / 2)
        return max(self.renewal_retry_delay, delay)


#: A task running beside a turn: ``(store, turn, lease, work, stop)``, where ``work`` is the
#: runner's task and ``stop(reason)`` cancels it.
_Helper = Callable[
    [SessionStore, TurnRecord, LeaseSettings, "asyncio.Task[TurnOutcome]", Callable[[str], None]],
    Coroutine[Any, Any, None],
]


async def _heartbeat(
    store: SessionStore,
    turn: TurnRecord,
    lease: LeaseSettings,
    work: asyncio.Task[TurnOutcome],
    stop: Callable[[str], None],
) -> None:
    """Renew the turn's lease while ``work`` runs; stop it when the lease is lost or an abort
    was requested. Failed renewals back off and are logged once per outage."""
    loop = asyncio.get_running_loop()
    # Where the lease stands on this process's clock: renewals are written with the
    # writer's clock too, so the claim's expiry and ours agree.
    lease_left = lease.lease_seconds
    if turn.lease_expires_at is not None:
        lease_left = (turn.lease_expires_at - datetime.now(UTC)).total_seconds()
    expires = loop.time() + lease_left
    failures = 0
    outage_started = 0.0
    while not work.done():
        attempted = loop.time()
        try:
            current = await store.renew_lease(
                turn.id, lease_token=turn.lease_token, lease_seconds=lease.lease_seconds
            )
        except StaleTransitionError:
            logger.warning("turn %s: lease %s lost; stopping", turn.id, turn.lease_token)
            stop("lease lost")
            return
        except Exception as exc:
            # The database hiccuped: keep heartbeating, with backoff. Giving up would let
            # the lease expire under a live runner and another worker repeat its tool call.
            failures += 1
            if failures == 1:
                outage_started = attempted
                logger.warning(
                    "turn %s: lease renewal failing (%s); retrying with backoff", turn.id, exc
                )
            else:
                logger.debug("turn %s: lease renewal failed again (%s)", turn.id, exc)
            # Always awaited, so a store that raises without awaiting cannot livelock us.
            await asyncio.sleep(lease.retry_delay(failures, expires - loop.time()))
            continue
        if failures:
            logger.info(
                "turn %s: lease renewed again after %d failed attempt(s) over %.1fs",
                turn.id,
                failures,
                attempted - outage_started,
            )
            failures = 0
        expires = attempted + lease.lease_seconds
        if current.status is TurnStatus.ABORTING:
            stop("abort")
            return
        await asyncio.sleep(lease.heartbeat_interval)


async def _watch_store(
    store: SessionStore,
    turn: TurnRecord,
    lease: LeaseSettings,
    work: asyncio.Task[TurnOutcome],
    stop: Callable[[str], None],
) -> None:
    """Stop ``work`` when another process requests the turn's abort."""
    loop = asyncio.get_running_loop()
    # Read the status now (an abort requested before we watched sent a notification nobody
    # here waited for), then at each change notification (NOTIFY) for the turn; the
    # heartbeat's check is the fallback.
    failing = False
    while not work.done():
        started = loop.time()
        try:
            current = await store.get_turn(turn.id)
        except Exception as exc:
            # Once per outage, as the heartbeat logs its own: a down database is one event.
            if not failing:
                logger.warning("turn %s: status check failing (%s); retrying", turn.id, exc)
            failing = True
            await asyncio.sleep(lease.heartbeat_interval)
            continue
        failing = False
        if current is not None and current.status is TurnStatus.ABORTING:
            stop("abort")
            return
        with contextlib.suppress(Exception):  # a failed wait is a poll: read again
            await store.wait_for_change(turn.id, lease.heartbeat_interval)
        # A store without notifications (SQLite) returns from every short poll: read the
        # status at most a few times a second, not once per poll.
        await asyncio.sleep(max(0.0, MIN_STATUS_CHECK_INTERVAL - (loop.time() - started)))


async def execute_claimed(
    config: RunnerConfig,
    store: SessionStore,
    claimed: ClaimedTurn,
    *,
    on_chunk: ChunkCallback | None = None,
    abort_signal: AbortSignal | None = None,
    lease: LeaseSettings | None = None,
    retry: RetryPolicy | None = None,
    then_claim: FollowOnClaim | None = None,
) -> TurnRecord:
    """Run a turn this caller has claimed (from the progress its claim returned) and settle
    it.

    Returns the settled record, or the ``pending`` record handed back for a retry (its
    ``run_after`` says when), or — if the lease was lost — whatever the store now holds.
    ``then_claim`` rides on the settling transition (see :class:`FollowOnClaim`): a worker
    pool fills the slot the turn frees without a round trip of its own.

    The attempt runs in its span (:func:`engine.telemetry.tracing.turn_span`), a child of the span
    that created the turn: the runner's task starts inside it, so its spans are the span's children.
    """
    turn = claimed.turn
    lease = lease or LeaseSettings()
    retry = retry or RetryPolicy(max_attempts=turn.max_attempts)
    with tracing.turn_span(turn) as span:
        runner = TurnRunner(config, store, claimed, on_chunk)
        outcome, stop_reason = await _run_watched(runner, store, turn, lease, abort_signal)
        settled = await _settle(store, turn, outcome, stop_reason, retry, then_claim)
        tracing.turn_settled(span, settled)
        return settled


async def _run_watched(
    runner: TurnRunner,
    store: SessionStore,
    turn: TurnRecord,
    lease: LeaseSettings,
    abort_signal: AbortSignal | None,
) -> tuple[TurnOutcome | None, list[str]]:
    """Run ``runner`` while the heartbeat, the store watch and ``abort_signal`` may stop it:
    its outcome, or ``None`` with why it was stopped (``stop_reason[0]``)."""
    work: asyncio.Task[TurnOutcome] = asyncio.create_task(runner.run())
    stop_reason: list[str] = []

    def stop(reason: str) -> None:
        if not stop_reason:
            stop_reason.append(reason)
            work.cancel()

    loop = asyncio.get_running_loop()

    def abort_here() -> None:  # an abort requested in this process (AbortSignal.set)
        stop("abort")

    if abort_signal is not None:
        abort_signal.add_listener(abort_here)
    helpers: list[asyncio.Task[None]] = []

    def start_helper(helper: _Helper) -> None:
        if not work.done():
            helpers.append(asyncio.create_task(helper(store, turn, lease, work, stop)))

    # Most turns settle long before anything else here is due: timers, not tasks, wait for
    # the store watch and the first renewal, so a turn does not pay for tasks it nearly
    # always cancels unused. An abort from another process in the watch's first
    # MIN_STATUS_CHECK_INTERVAL is seen by its first read; one from this process is
    # immediate (abort_here).
    timers = [
        loop.call_later(MIN_STATUS_CHECK_INTERVAL, start_helper, _watch_store),
        loop.call_later(lease.heartbeat_interval, start_helper, _heartbeat),
    ]
    outcome: TurnOutcome | None = None
    try:
        outcome = await work
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if not stop_reason or (current is not None and current.cancelling()):
            raise  # our own caller is being cancelled (e.g. worker shutdown)
    except StaleTransitionError as refused:
        # A fenced write was refused: another worker holds the turn now. Write nothing more.
        logger.warning("turn %s: %s; stopping", turn.id, refused)
        stop_reason.insert(0, "lease lost")
    finally:
        if abort_signal is not None:
            abort_signal.remove_listener(abort_here)
        for timer in timers:
            timer.cancel()
        for helper in helpers:
            helper.cancel()
        # A helper's own failure must never replace the turn's outcome.
        await asyncio.gather(*helpers, return_exceptions=True)
    return outcome, stop_reason


async def _settle(
    store: SessionStore,
    turn: TurnRecord,
    outcome: TurnOutcome | None,
    stop_reason: list[str],
    retry: RetryPolicy,
    then_claim: FollowOnClaim | None,
) -> TurnRecord:
    """The settling transition of a run that ended with ``outcome`` (``None``: stopped for
    ``stop_reason[0]``), fenced by the turn's lease token."""
    try:
        if outcome is None:
            if stop_reason[0] == "lease lost":
                instruments.lease_lost(turn.agent)
                return await store.get_turn(turn.id) or turn
            logger.info("turn %s aborted", turn.id)
            return await store.transition(
                turn.id,
                Transition(
                    expected=ACTIVE_STATUSES,
                    new=TurnStatus.ABORTED,
                    lease_token=turn.lease_token,
                    finish_reason=FinishReason.ABORTED,
                    note="stopped at abort",
                    then_claim=then_claim,
                ),
            )
        if outcome.transient and turn.attempts < retry.max_attempts:
            delay = retry.delay(turn.attempts)
            logger.info(
                "turn %s attempt %d failed transiently (%s); retrying in %.2fs",
                turn.id,
                turn.attempts,
                outcome.error.message if outcome.error else "",
                delay,
            )
            return await store.transition(
                turn.id,
                Transition(
                    expected={TurnStatus.PENDING},
                    new=TurnStatus.PENDING,
                    lease_token=turn.lease_token,
                    error=outcome.error,
                    run_after=datetime.now(UTC) + timedelta(seconds=delay),
                    note=f"retry after attempt {turn.attempts}",
                    usage=outcome.usage,
                    then_claim=then_claim,
                ),
            )
        # The turn's last round (if the runner left it to us) is written by the same fenced
        # transaction that settles the turn: one commit instead of two.
        return await store.transition(
            turn.id,
            Transition(
                expected=ACTIVE_STATUSES,
                new=outcome.status,
                lease_token=turn.lease_token,
                finish_reason=outcome.finish_reason,
                error=outcome.error,
                round=outcome.last_round,
                calls=outcome.last_calls,
                usage=outcome.usage,
                then_claim=then_claim,
            ),
        )
    except StaleTransitionError:
        # Someone else moved the turn (abort of an unleased retry, a newer lease): report
        # what the store holds rather than overwrite it.
        return await store.get_turn(turn.id) or turn


async def run_inline(
    config: RunnerConfig,
    store: SessionStore,
    turn_id: str,
    *,
    owner: str,
    on_chunk: ChunkCallback | None = None,
    abort_signal: AbortSignal | None = None,
    lease: LeaseSettings | None = None,
    retry: RetryPolicy | None = None,
    claimed: ClaimedTurn | None = None,
) -> TurnRecord:
    """Claim ``turn_id`` in this process and run it until it settles (retries included).
    ``claimed``: the turn as its creation leased it to ``owner``, run without a claim."""
    lease = lease or LeaseSettings()
    while True:
        try:
            if claimed is None:
                claimed = await store.claim_turn(
                    turn_id, owner=owner, lease_seconds=lease.lease_seconds
                )
        except StaleTransitionError:
            current = await store.get_turn(turn_id)
            if current is None or current.status not in ACTIVE_STATUSES:
                if current is None:
                    raise
                return current
            if current.status is TurnStatus.PENDING and current.lease_owner in (None, owner):
                # Waiting for its retry time, or leased to us by a creation whose answer
                # was lost: ours to claim once that time and that lease have passed.
                due = max(current.run_after, current.lease_expires_at or current.run_after)
                wait = (due - datetime.now(UTC)).total_seconds()
                await asyncio.sleep(max(0.01, wait))
                continue
            raise
        record = await execute_claimed(
            config,
            store,
            claimed,
            on_chunk=on_chunk,
            abort_signal=abort_signal,
            lease=lease,
            retry=retry,
        )
        claimed = None
        if record.status is not TurnStatus.PENDING:
            return record
