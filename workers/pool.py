"""The worker pool: claim queued turns from a shared store and run them, N at a time.

Several pools — in one process, or in many processes on many machines — share one database.
The loop has procrastinate's worker's shape: a semaphore with one unit per slot bounds the turns
running at once, a stop event ends the loop, and each iteration makes one claim. It takes the
free slots (waiting for one while the pool is full), claims at most that many turns in one
statement of the store (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, committed before any work
starts), and runs each claimed turn with :func:`engine.turns.executor.execute_claimed`, which
heartbeats the lease and fences every write with the lease token. When the claim comes back
short the pool sleeps until the store hints at new work (LISTEN/NOTIFY), the poll interval
passes, or it is told to stop.

Stopping is graceful: claiming stops at once, running turns get ``shutdown_grace`` seconds to
settle, and the rest are cancelled and handed back ``pending`` with their lease released, so
another worker continues them at once from their journal. The pool returns within the grace
period plus :data:`SHUTDOWN_MARGIN`, even with a synchronous tool still running in its thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from engine import Agent, Engine, TurnStatus
from engine.errors import StaleTransitionError
from engine.response import AgentChunk
from engine.status import SETTLED_STATUSES, FinishReason
from engine.store import ClaimedTurn, FollowOnClaim, SessionStore, Transition, TurnRecord
from engine.store.signals import AbortSignal
from engine.telemetry.log_context import turn_context
from engine.turns.executor import execute_claimed
from engine.turns.handover import SlotReservation
from workers.observers import PoolObserver
from workers.scheduler import MaintenanceScheduler

__all__ = ["WorkerPool"]

logger = logging.getLogger("turnstile.worker")

#: Longest pause between claim attempts while the store keeps failing (e.g. DB restarting).
MAX_CLAIM_BACKOFF = 5.0

#: After the grace period, how long the cancelled turns get to stop and be handed back; past
#: it the pool stops without them, and their leases hand them to another worker.
SHUTDOWN_MARGIN = 5.0


def default_owner() -> str:
    """``host:pid:random``: unique per pool, readable in ``lease_owner`` by an operator."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _single_store(engine: Engine) -> SessionStore:
    stores: list[SessionStore] = []
    for agent in engine.agents.values():
        if agent.store is not None and agent.queued and all(agent.store is not s for s in stores):
            stores.append(agent.store)
    if len(stores) != 1:
        found = "none" if not stores else f"{len(stores)} different stores"
        raise ValueError(
            "WorkerPool(engine) needs exactly one store shared by the engine's queued agents "
            f"(durable store or execution='workers'), found {found}; pass store= explicitly."
        )
    return stores[0]


class WorkerPool:
    """Runs the queued turns of ``engine``'s agents that live in ``store``.

    ``store`` defaults to the one store shared by the engine's queued agents. The pool serves
    the agents whose ``store`` is that store and whose turns are queued (``agent.queued``):
    an inline agent's turn is claimed by the caller that created it, and a pool claiming it
    first would make that caller fail. ``owner`` names this pool in the turns' lease.
    """

    def __init__(
        self,
        engine: Engine,
        store: SessionStore | None = None,
        *,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        owner: str | None = None,
        shutdown_grace: float = 10.0,
        expiry_interval: float = 5.0,
        scheduler: bool = True,
        retention: float | None = None,
        retention_interval: float = 300.0,
        observers: Iterable[PoolObserver] = (),
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1.")
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive.")
        self.engine = engine
        self.store = store if store is not None else _single_store(engine)
        self.agents: dict[str, Agent] = {
            name: agent
            for name, agent in engine.agents.items()
            if agent.store is self.store and agent.queued
        }
        if not self.agents:
            raise ValueError(
                "No agent of this engine runs in workers on this store: define agents with "
                "this store and a durable store or execution='workers'."
            )
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.owner = owner or default_owner()
        self.shutdown_grace = shutdown_grace
        self.lease_seconds = max(a.lease.lease_seconds for a in self.agents.values())
        #: The application versions this pool serves: it claims only turns pinned to one
        #: of them, so a turn never runs in a worker lacking its version.
        self.versions: list[str] = sorted(
            {v for agent in self.agents.values() for v in agent.served_versions}
        )
        self.scheduler = (
            MaintenanceScheduler(
                engine,
                self.store,
                expiry_interval=expiry_interval,
                retention=retention,
                retention_interval=retention_interval,
            )
            if scheduler
            else None
        )
        #: Turns claimed since the pool was created.
        self.claimed_total = 0
        #: Claimed turns that this pool ran to a settled status (completed/failed/aborted).
        self.settled_total = 0
        #: Turns handed back ``pending`` at shutdown (their runs were cancelled).
        self.handed_back_total = 0
        #: One unit per slot: a running turn holds one, and the claim loop takes the free
        #: ones before it claims, so a claim never asks for more turns than can start.
        self._slots = asyncio.Semaphore(concurrency)
        #: A slot's follow-on claim found the queue empty since the last claim of the loop:
        #: the slot it freed need not scan the queue again (see _claim).
        self._queue_seen_empty = False
        #: The follow-on claim each running slot will ask its settle for. Live only while
        #: every slot is busy (see _refresh_follows); withdrawn at stop.
        self._follows: dict[asyncio.Task[None], FollowOnClaim] = {}
        self._tasks: dict[asyncio.Task[None], TurnRecord] = {}
        self._observers: list[PoolObserver] = list(observers)
        self._stop = asyncio.Event()
        #: Done once a stop is requested: raced against the loop's waits as a future, so a
        #: wait costs no task of its own for the stop. Made by run(), which has a loop.
        self._stopped: asyncio.Future[None] | None = None
        self._force = asyncio.Event()
        self._done: asyncio.Event | None = None
        #: Set whenever a slot frees (see _wait_for_slot).
        self._slot_freed = asyncio.Event()
        #: The slot tasks holding a unit of the slot semaphore, until they free it.
        self._holding: set[asyncio.Task[None]] = set()
        #: Hand-backs of turns created for a slot after the pool began stopping.
        self._handing_back: set[asyncio.Future[None]] = set()
        self._background: asyncio.Task[None] | None = None

    # -- observing ---------------------------------------------------------------------

    @property
    def running(self) -> set[str]:
        """Ids of the turns this pool is running right now."""
        return {turn.id for turn in self._tasks.values()}

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested (the pool no longer claims)."""
        return self._stop.is_set()

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> WorkerPool:
        """Start :meth:`run` in a background task."""
        self._background = asyncio.create_task(self.run(), name=f"worker-pool {self.owner}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop gracefully (see :meth:`stop`)."""
        await self.stop()

    def request_stop(self, *, force: bool = False) -> None:
        """Stop claiming now; with ``force``, also skip the grace period for running turns.

        Synchronous, so a signal handler can call it.
        """
        self._stop.set()
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        self._refresh_follows()  # a settle after this claims nothing for its slot
        if force:
            self._force.set()

    async def stop(self, *, force: bool = False) -> None:
        """Stop claiming, let running turns finish for up to ``shutdown_grace`` seconds, hand
        back the rest, and return once :meth:`run` has ended."""
        self.request_stop(force=force)
        if self._background is not None:
            background, self._background = self._background, None
            await background  # re-raises if the loop itself crashed
        elif self._done is not None:
            await self._done.wait()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Claim and run turns until ``stop`` is set (or :meth:`stop` is called), then shut
        down gracefully. A pool runs once."""
        if self._done is not None:
            raise RuntimeError("This WorkerPool has already been run; create a new one.")
        self._done = asyncio.Event()
        self._stopped = asyncio.get_running_loop().create_future()
        if self._stop.is_set():  # stopped before it ran
            self._stopped.set_result(None)
        forward = asyncio.create_task(self._forward_stop(stop)) if stop is not None else None
        logger.info(
            "worker %s serving %s at versions %s (concurrency %d)",
            self.owner,
            sorted(self.agents),
            self.versions,
            self.concurrency,
        )
        # Turns created in this process start in a free slot, leased at creation.
        self.engine.local_pools.append(self)
        try:
            if self.scheduler is not None:
                self.scheduler.start()
            await self._claim_loop()
        finally:
            self.request_stop()
            self.engine.local_pools.remove(self)
            if forward is not None:
                forward.cancel()
            task = asyncio.current_task()
            # If run() itself is being cancelled, our caller wants out now: no grace period.
            if task is not None and task.cancelling():
                self._force.set()
            try:
                grace = 0.0 if self._force.is_set() else self.shutdown_grace
                stopping = [self._drain()]
                if self.scheduler is not None:
                    stopping.append(self.scheduler.shutdown(grace))
                await asyncio.gather(*stopping)
            finally:
                self._done.set()
                logger.info(
                    "worker %s stopped (claimed %d, settled %d, handed back %d)",
                    self.owner,
                    self.claimed_total,
                    self.settled_total,
                    self.handed_back_total,
                )

    async def _forward_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.request_stop()

    # -- turns created in this process ------------------------------------------------

    async def reserve(
        self, *, store: SessionStore, agent: str, app_version: str | None
    ) -> SlotReservation | None:
        """A free slot for a turn this process creates, if this pool would claim that turn
        (see :class:`engine.turns.handover.LocalSlots`); ``None`` while stopping or full."""
        if (
            store is not self.store
            or agent not in self.agents
            or (app_version is not None and app_version not in self.versions)
            or self._stop.is_set()
            or self._slots.locked()
        ):
            return None
        # Not locked: the acquire returns at once, before any other task runs.
        await self._slots.acquire()
        return _ReservedSlot(self)

    def _run_created(self, claimed: ClaimedTurn) -> None:
        """Start a turn created leased to this pool in the slot reserved for it; handed
        back at once if the pool began stopping meanwhile."""
        if not self._stop.is_set():
            self._start(claimed)
            return
        self._release_slots(1)
        handing_back = asyncio.ensure_future(self._hand_back(claimed.turn, note="worker shutdown"))
        self._handing_back.add(handing_back)
        handing_back.add_done_callback(self._handing_back.discard)

    # -- claiming ----------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        """Until stopped: take the free slots, make one claim for at most that many turns,
        start what it returned, and sleep until work is announced if it came back short."""
        failures = 0
        hinted = False  # this claim answers a work notification
        while not self._stop.is_set():
            free, waited = await self._take_free_slots()
            if free == 0:
                break  # stopped while waiting for a slot
            try:
                # A wait for a slot answers no notification: hints are for an idle pool.
                claimed = await self._claim(free, hinted=hinted and not waited, slot_freed=waited)
            except Exception:
                self._release_slots(free)
                failures += 1
                hinted = False  # the hints taken are lost with this claim: scan next time
                delay = min(MAX_CLAIM_BACKOFF, 0.1 * 2**failures)
                logger.warning(
                    "claim failed (%d in a row); retrying in %.1fs", failures, delay, exc_info=True
                )
                await self._unless_stopped(timeout=delay)
                continue
            if claimed is not None:
                failures = 0
            for taken in claimed or ():
                self._start(taken)  # each takes one of the slots taken above
            self._release_slots(free - len(claimed or ()))
            if claimed is not None and len(claimed) == free:
                hinted = False
                continue  # every slot taken: maybe more is queued; the loop re-checks
            # Fewer than asked: the queue is empty for us, so sleep until a hint. A slot
            # freeing meanwhile does not wake us: it adds no work (a claim then would find
            # nothing — a wasted transaction after every turn), and anything queued since
            # the claim sent a work notification, or is found by the poll (retries whose
            # run_after is later, expired leases). Only a full pool waits for a slot.
            hinted = await self._wait_for_work()

    async def _take_free_slots(self) -> tuple[int, bool]:
        """Take every free slot, first waiting for one while the pool is full; how many were
        taken (0: stopped while waiting) and whether it waited.

        No claim while full: a claimed turn we cannot start at once would sit leased and
        idle while another worker could be running it.
        """
        waited = self._slots.locked()
        if waited:
            if not await self._wait_for_slot():
                return 0, True
        else:
            await self._slots.acquire()  # returns at once: a slot is free
        taken = 1
        while not self._slots.locked():
            await self._slots.acquire()
            taken += 1
        return taken, waited

    async def _wait_for_slot(self) -> bool:
        """Wait until a slot frees and take it; ``False`` on stop.

        Woken by the freeing, not queued on the semaphore: a queued acquire would own the
        freed slot at once, and a turn this process creates next (for which the slot was
        freed, as often as not) would find the pool full and go through the queue. Taken
        only if still free when the loop runs again.
        """
        while self._slots.locked():
            self._slot_freed.clear()
            freed = asyncio.ensure_future(self._slot_freed.wait())
            try:
                await self._unless_stopped(freed)
            finally:
                freed.cancel()
            if self._stop.is_set():
                return False
        await self._slots.acquire()  # returns at once: a slot is free
        return True

    def _release_slots(self, count: int) -> None:
        for _ in range(count):
            self._slots.release()
        self._slot_freed.set()

    async def _claim(
        self, limit: int, *, hinted: bool, slot_freed: bool
    ) -> list[ClaimedTurn] | None:
        """The loop's one claim, for at most ``limit`` turns; ``None`` when a claim could
        find nothing, so none is sent."""
        seen_empty, self._queue_seen_empty = self._queue_seen_empty, False
        if slot_freed and seen_empty:
            # The slot freed by a settle that already claimed for it and found nothing: a
            # scan now would find nothing either. Work queued since then was announced,
            # and the wait for work returns at once for it.
            return None
        # After a work notification, claim the turns it named by their primary key: a scan
        # of the claim index steps over every dead entry left since the last vacuum. Any
        # other time (poll, start, a slot freed, missed notifications) scan the queue; the
        # hints it covers are dropped first.
        hints = self.store.take_work_hints()
        among = hints if hinted else None
        if among == []:  # woken by a notification already served by the last claim
            return None
        return await self.store.claim_next(
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            limit=limit,
            agents=sorted(self.agents),
            among=among,
            versions=self.versions,
        )

    async def _wait_for_work(self) -> bool:
        """Sleep until the store announces work, the poll interval passes, or a stop; whether
        it was an announcement (woken before the poll interval ran out)."""
        if self._stop.is_set():
            return False
        loop = asyncio.get_running_loop()
        started = loop.time()
        # wait_for_work is only a hint (NOTIFY may be missed); its timeout is the poll.
        waiting = asyncio.ensure_future(self.store.wait_for_work(self.poll_interval))
        try:
            await self._unless_stopped(waiting)
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        if waiting.cancelled():
            return False  # stopped
        if waiting.exception() is not None:
            logger.warning("waiting for work failed", exc_info=waiting.exception())
            await self._unless_stopped(timeout=self.poll_interval)
            return False
        return loop.time() - started < self.poll_interval * 0.9

    async def _unless_stopped(
        self, waiting: asyncio.Future[Any] | None = None, *, timeout: float | None = None
    ) -> None:
        """Wait for ``waiting`` to finish (or ``timeout`` seconds to pass), returning early
        on a stop."""
        assert self._stopped is not None, "only run() waits"
        waits: set[asyncio.Future[Any]] = {self._stopped}
        if waiting is not None:
            waits.add(waiting)
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)

    def _start(self, claimed: ClaimedTurn, *, holds_slot: bool = True) -> None:
        """Run a claimed turn in a slot task; ``holds_slot``: the task owns one unit of the
        slot semaphore, given back when it ends."""
        turn = claimed.turn
        self._note_claimed(turn)
        task = asyncio.create_task(self._run_slot(claimed), name=f"turn {turn.id}")
        self._tasks[task] = turn
        if holds_slot:
            self._holding.add(task)
        self._refresh_follows()
        task.add_done_callback(self._finished)

    def _note_claimed(self, turn: TurnRecord) -> None:
        self.claimed_total += 1
        with turn_context(turn):
            logger.info(
                "turn %s attempt %d claimed (agent %s)",
                turn.id,
                turn.attempts,
                turn.agent,
                extra={"turn_id": turn.id, "attempt": turn.attempts},
            )
        for observer in self._observers:
            observer.turn_claimed(turn)

    def add_observer(self, observer: PoolObserver) -> None:
        """Report each turn this pool claims and finishes to ``observer`` (metrics, a
        benchmark's clock): see :class:`workers.observers.PoolObserver`."""
        self._observers.append(observer)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """Forget a slot task that ended and free its slot, if it holds one still."""
        self._tasks.pop(task, None)
        self._refresh_follows()
        if task in self._holding:
            self._holding.discard(task)
            self._release_slots(1)

    def _refresh_follows(self) -> None:
        """Let settles claim for their slot only while every slot is busy: exactly when a
        freed slot would otherwise scan the queue. With a slot free the pool is waiting for
        work notifications, and a scan per settle would mostly find turns another pool is
        already claiming by id."""
        live = 1 if len(self._tasks) >= self.concurrency and not self._stop.is_set() else 0
        for follow in self._follows.values():
            follow.limit = live

    # -- running one turn --------------------------------------------------------------

    async def _run_slot(self, claimed: ClaimedTurn) -> None:
        """Run claimed turns in one slot: this one, then each turn its settle claimed next.

        The settling transition carries a claim for the slot it frees (one round trip and
        one commit on PostgreSQL), so a busy pool goes from one turn to the next without a
        claim statement of its own. Only while every slot is busy, and not once the pool
        is stopping (see _refresh_follows).
        """
        task = asyncio.current_task()
        assert task is not None
        while True:
            follow = None
            if not self._stop.is_set():
                follow = FollowOnClaim(
                    owner=self.owner,
                    lease_seconds=self.lease_seconds,
                    agents=sorted(self.agents),
                    versions=self.versions,
                )
                self._follows[task] = follow
                self._refresh_follows()
            try:
                await self._execute(claimed, follow)
            except asyncio.CancelledError:
                for unrun in follow.claimed if follow else []:
                    await self._hand_back(unrun.turn, note="worker shutdown")
                raise
            finally:
                self._follows.pop(task, None)
            if follow is None or not follow.claimed:
                self._queue_seen_empty = self._queue_seen_empty or (
                    follow is not None and follow.ran
                )
                # Free the slot now, not from the task's done callback: whoever waited
                # for the settle runs before that callback, and a turn it creates at once
                # should find this slot free.
                self._finished(task)
                return
            claimed, *extra = follow.claimed
            for more in extra:  # limit 1: a store that leased more still runs them
                self._start(more, holds_slot=False)
            self._tasks[task] = claimed.turn
            self._note_claimed(claimed.turn)

    async def _execute(self, claimed: ClaimedTurn, follow: FollowOnClaim | None = None) -> None:
        """Run one claimed turn; every line logged meanwhile names it (its turn_id,
        session_id and agent, engine/telemetry/log_context.py)."""
        with turn_context(claimed.turn):
            await self._execute_in_context(claimed, follow)

    async def _execute_in_context(
        self, claimed: ClaimedTurn, follow: FollowOnClaim | None = None
    ) -> None:
        """Run one claimed turn; logs every failure (a turn never takes the pool down)."""
        turn = claimed.turn
        agent = self.agents.get(turn.agent)
        if agent is None:  # the store ignored agents=: not ours to run
            logger.error("turn %s belongs to agent %s, not served here", turn.id, turn.agent)
            await self._hand_back(turn, note="agent not served by this worker")
            return
        signal = AbortSignal()
        # Registered so agent.abort() in this process stops the turn at once; an abort from
        # another process arrives through the store (change notification or heartbeat).
        self.engine.local_aborts[turn.id] = signal
        store = self.store

        async def relay(chunk: AgentChunk) -> None:
            try:
                await store.publish_chunk(turn.id, chunk.to_wire())
            except Exception as exc:  # a lost progress update must not fail the turn
                logger.warning("turn %s: chunk not relayed (%s)", turn.id, exc)

        started = time.monotonic()
        try:
            settled = await execute_claimed(
                agent.runner_config(),
                self.store,
                claimed,
                # Only a turn somebody streams pays for relaying its chunks.
                on_chunk=relay if turn.input.relay else None,
                abort_signal=signal,
                lease=agent.lease,
                retry=agent.retry,
                then_claim=follow,
            )
        except asyncio.CancelledError:
            raise  # shutdown: _drain hands the turn back
        except Exception:
            # E.g. the store failed while settling: the lease will expire and the claim
            # query gives the turn to a worker again, continuing from its journal.
            logger.exception(
                "turn %s attempt %d: run failed; left to its lease", turn.id, turn.attempts
            )
            self._report_finished(turn, None, started)
            return
        finally:
            if self.engine.local_aborts.get(turn.id) is signal:
                del self.engine.local_aborts[turn.id]
        if settled.status in SETTLED_STATUSES:
            self.settled_total += 1
        self._report_finished(turn, settled, started)
        logger.info(
            "turn %s attempt %d %s%s",
            turn.id,
            turn.attempts,
            settled.status.value,
            f" ({settled.finish_reason.value})" if settled.finish_reason else "",
            extra={"turn_id": turn.id, "attempt": turn.attempts},
        )

    def _report_finished(
        self, turn: TurnRecord, settled: TurnRecord | None, started: float
    ) -> None:
        seconds = time.monotonic() - started
        for observer in self._observers:
            observer.turn_finished(turn, settled, seconds)

    # -- shutting down -----------------------------------------------------------------

    async def _drain(self) -> None:
        """Give running turns the grace period, then cancel and hand back the rest."""
        pending = {task for task in self._tasks if not task.done()}
        if pending and not self._force.is_set():
            logger.info(
                "stopping: waiting up to %.1fs for %d running turn(s)",
                self.shutdown_grace,
                len(pending),
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.shutdown_grace
            force = asyncio.create_task(self._force.wait())
            try:
                while pending and not force.done() and (left := deadline - loop.time()) > 0:
                    await asyncio.wait(
                        {*pending, force}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                    )
                    pending = {t for t in pending if not t.done()}
            finally:
                force.cancel()
        pending = {task for task in self._tasks if not task.done()}
        turns = {task: self._tasks[task] for task in pending}
        for task in pending:
            task.cancel()
        try:
            await asyncio.wait_for(self._hand_back_cancelled(turns), SHUTDOWN_MARGIN)
        except TimeoutError:
            logger.warning(
                "stopping: turns did not stop within %.1fs of the grace period; left to "
                "their leases",
                SHUTDOWN_MARGIN,
            )

    async def _hand_back_cancelled(self, turns: dict[asyncio.Task[None], TurnRecord]) -> None:
        """Wait for the cancelled slot tasks to end, then hand back the turns they ran.

        A synchronous tool does not delay this: its thread is abandoned, not waited for
        (:func:`engine.tools.in_daemon_thread`), and its journal row stays ``running``.
        """
        await asyncio.gather(*turns, return_exceptions=True)
        for task, turn in turns.items():
            if task.cancelled():
                await self._hand_back(turn, note="worker shutdown")

    async def _hand_back(self, turn: TurnRecord, *, note: str) -> None:
        """Release a turn we stopped: ``pending`` again (claimable now), or — if an abort
        was requested meanwhile — ``aborted``, since nobody claims an ``aborting`` turn."""
        try:
            await self.store.transition(
                turn.id,
                Transition(
                    expected={TurnStatus.PENDING},
                    new=TurnStatus.PENDING,
                    lease_token=turn.lease_token,
                    run_after=datetime.now(UTC),
                    note=note,
                ),
            )
            self.handed_back_total += 1
            logger.info("turn %s attempt %d handed back: %s", turn.id, turn.attempts, note)
            return
        except StaleTransitionError:
            pass  # settled, re-leased or aborting meanwhile: see below
        except Exception:
            logger.exception("turn %s: hand-back failed; left to its lease", turn.id)
            return
        try:
            await self.store.transition(
                turn.id,
                Transition(
                    expected={TurnStatus.ABORTING},
                    new=TurnStatus.ABORTED,
                    lease_token=turn.lease_token,
                    finish_reason=FinishReason.ABORTED,
                    note=f"stopped at abort ({note})",
                ),
            )
            logger.info("turn %s attempt %d aborted at %s", turn.id, turn.attempts, note)
        except StaleTransitionError:
            pass  # it settled, or another worker holds it now: nothing of ours to release
        except Exception:
            logger.exception("turn %s: settling the abort failed; left to its lease", turn.id)


class _ReservedSlot:
    """A slot of ``pool`` held for a turn about to be created leased to the pool."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool
        self.owner = pool.owner
        self.lease_seconds = pool.lease_seconds

    def run(self, claimed: ClaimedTurn) -> None:
        """See :meth:`engine.turns.handover.SlotReservation.run`."""
        self._pool._run_created(claimed)

    def release(self) -> None:
        """See :meth:`engine.turns.handover.SlotReservation.release`."""
        self._pool._release_slots(1)
