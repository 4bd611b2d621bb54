"""Waiting for a turn to settle, whichever process runs it.

Waits are woken by the store's change notifications and fall back to polling, because a
notification is only a hint: it may be missed, and a turn may be run by another process.

A wait is not silent when nothing happens: a queued turn that no worker has claimed after
``unclaimed_warning`` seconds is logged once (a WARNING naming the turn), and a wait given a
``timeout`` ends with :class:`~engine.errors.TurnTimeoutError`, leaving the turn as it is. A
wait given a ``worker_wait`` ends sooner, with :class:`~engine.errors.NoWorkerError`, when no
worker has claimed the turn by then (the caller would rather answer than wait for a worker that
may never come; the turn stays queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from engine.errors import NotFoundError, NoWorkerError, TurnTimeoutError
from engine.status import ACTIVE_STATUSES, TurnStatus
from engine.store import SessionStore, StoredSnapshot, TurnRecord

__all__ = ["never_claimed", "timed_out", "wait_settled"]

logger = logging.getLogger("turnstile.agent")


def never_claimed(turn: TurnRecord) -> bool:
    """Whether ``turn`` is pending and no worker has ever claimed it."""
    return turn.status is TurnStatus.PENDING and turn.attempts == 0 and turn.lease_owner is None


class _UnclaimedWatch:
    """Logs once when a waited-for turn stays unclaimed past ``warn_after`` seconds, and gives
    up on it past ``give_up_after`` seconds (``None`` or 0: never, for either)."""

    def __init__(
        self,
        store: SessionStore,
        agent: str,
        now: float,
        warn_after: float | None,
        give_up_after: float | None,
    ) -> None:
        self._store = store
        self._agent = agent
        self._warn_after = warn_after
        self._warn_due = None if not warn_after else now + warn_after
        self._give_up_after = give_up_after
        self._give_up_due = None if not give_up_after else now + give_up_after

    def until_next_check(self, now: float) -> float | None:
        """Seconds until the next check is due (``None``: no check left), so a wait sleeps no
        longer than that."""
        dues = [due for due in (self._warn_due, self._give_up_due) if due is not None]
        return max(0.0, min(dues) - now) if dues else None

    def check(self, turn: TurnRecord, now: float) -> None:
        """Warn or give up on ``turn`` (as just read) when its time has come."""
        if self._give_up_due is not None and now >= self._give_up_due:
            self._give_up_due = None  # claimed by now: the wait goes on as usual
            if never_claimed(turn):
                raise self._no_worker(turn)
        if self._warn_due is None or now < self._warn_due:
            return
        self._warn_due = None  # once per wait, claimed or not
        if never_claimed(turn):
            logger.warning(
                "turn %s of agent %s: no worker has claimed it after %gs; is a worker "
                "(turnstile worker, or turnstile serve --workers N) serving version %s "
                "running on %r with a free slot? Still waiting",
                turn.id,
                self._agent,
                self._warn_after,
                turn.app_version or "(any)",
                self._store,
                extra=self._fields(turn),
            )

    def _no_worker(self, turn: TurnRecord) -> NoWorkerError:
        logger.warning(
            "turn %s of agent %s: no worker claimed it within %gs; the wait ends, the turn "
            "stays queued",
            turn.id,
            self._agent,
            self._give_up_after,
            extra=self._fields(turn),
        )
        return NoWorkerError(
            f"No worker claimed turn {turn.id} within {self._give_up_after:g}s. It is not "
            "failed: it stays queued and runs when a worker serving this agent is free (fetch "
            "it later with getSnapshot, or abort it). Is a worker running (turnstile worker, "
            "or turnstile serve --workers N)?",
            snapshot_id=turn.id,
            details={"snapshotId": turn.id},
        )

    def _fields(self, turn: TurnRecord) -> dict[str, str | None]:
        return {
            "turn_id": turn.id,
            "session_id": turn.session_id,
            "agent": self._agent,
            "app_version": turn.app_version,
        }


def _sooner(first: float | None, second: float | None) -> float | None:
    """The shorter of two waits, ``None`` standing for no limit."""
    if first is None or second is None:
        return second if first is None else first
    return min(first, second)


def timed_out(turn_id: str, timeout: float | None, turn: TurnRecord | None) -> TurnTimeoutError:
    """The error of a wait for ``turn_id`` that ``timeout`` ended, saying where the turn
    stands (``turn``: as last read) and how to wait again or stop it."""
    if turn is None or turn.status is TurnStatus.PENDING:
        state = (
            "still pending, not claimed by any worker yet"
            if turn is not None and never_claimed(turn)
            else "still pending"
        )
    else:
        state = f"still {turn.status.value}"
    return TurnTimeoutError(
        f"Snapshot {turn_id} did not settle within {timeout:g}s; it is {state} and left as "
        f"it is. Wait again with agent.wait({turn_id!r}), or stop it with "
        f"agent.abort({turn_id!r}).",
        snapshot_id=turn_id,
    )


async def wait_settled(
    store: SessionStore,
    turn_id: str,
    *,
    agent: str,
    poll_interval: float,
    timeout: float | None = None,
    listening: asyncio.Future[None] | None = None,
    unclaimed_warning: float | None = None,
    worker_wait: float | None = None,
) -> StoredSnapshot:
    """Wait until a turn settles and return it, with its conversation and journal (read
    together, in one round trip where the store can).

    Woken by the store's change notifications, re-checking every ``poll_interval`` seconds
    in case one was missed. Raises :class:`TurnTimeoutError` (a :class:`TimeoutError`) after
    ``timeout``, and :class:`NotFoundError` (naming ``agent``) when the turn does not exist.
    ``listening``: a wait for the turn's change notification registered before the turn was
    created (nothing can have been missed): awaited first, without a read.
    ``unclaimed_warning``: seconds after which a turn no worker has claimed is logged, once
    (``None`` or 0: never). ``worker_wait``: seconds after which a turn no worker has claimed
    ends the wait with :class:`~engine.errors.NoWorkerError` (``None``: never).
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    unclaimed = _UnclaimedWatch(store, agent, loop.time(), unclaimed_warning, worker_wait)
    if listening is not None:
        first_wait = _sooner(timeout, unclaimed.until_next_check(loop.time()))
        with contextlib.suppress(TimeoutError):  # past the deadline or a check: below
            await asyncio.wait_for(listening, first_wait)
    # The first check usually follows the settle's notification: read the turn whole. A
    # turn still running then is polled by its row alone (a long turn must not cost its
    # whole conversation every poll) and read whole once settled.
    whole = True
    turn: TurnRecord | None = None
    while True:
        wait_for = poll_interval
        if deadline is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise timed_out(turn_id, timeout, turn)
            wait_for = min(wait_for, remaining)
        next_check = unclaimed.until_next_check(loop.time())
        if next_check is not None:
            wait_for = min(wait_for, next_check)
        # Listen before reading: a settlement that lands between the read and the wait
        # must still wake us (the waiter registers as soon as the read yields).
        waiter = asyncio.ensure_future(store.wait_for_change(turn_id, wait_for))
        try:
            if whole:
                stored = await store.read_snapshot(turn_id)
                turn = stored.turn if stored is not None else None
            else:
                stored, turn = None, await store.get_turn(turn_id)
            if turn is not None and turn.status not in ACTIVE_STATUSES:
                settled = stored or await store.read_snapshot(turn_id)
                if settled is not None:
                    return settled
                turn = None  # gone since (pruned)
            if turn is None:
                raise NotFoundError(f"Snapshot '{turn_id}' not found for agent '{agent}'.")
            unclaimed.check(turn, loop.time())
            whole = False
            await waiter
        finally:
            waiter.cancel()
