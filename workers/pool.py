"""The worker pool: claim queued turns from a shared store and run them, N at a time.

Several pools — in one process, or in many processes on many machines — share one database.
Each loop iteration claims at most as many turns as it has free slots, in one statement of the
store (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, committed before any work starts), then runs
each claimed turn with :func:`engine.executor.execute_claimed`, which heartbeats the lease and
fences every write with the lease token. Between claims the pool sleeps until the store hints
at new work (LISTEN/NOTIFY), a slot frees, the poll interval passes, or it is told to stop.

Stopping is graceful: claiming stops at once, running turns get ``shutdown_grace`` seconds to
settle, and the rest are cancelled and handed back ``pending`` with their lease released, so
another worker continues them at once from their journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from datetime import UTC, datetime
from types import TracebackType

from engine import Agent, Engine, SessionStore, StaleTransitionError, TurnStatus
from engine.executor import execute_claimed
from engine.response import AgentChunk
from engine.signals import AbortSignal
from engine.status import SETTLED_STATUSES, FinishReason
from engine.store import FollowOnClaim, Transition, TurnRecord
from workers.scheduler import MaintenanceScheduler

__all__ = ["WorkerPool"]

logger = logging.getLogger("turnstile.worker")

#: Longest pause between claim attempts while the store keeps failing (e.g. DB restarting).
MAX_CLAIM_BACKOFF = 5.0

#: How long a pool whose last hinted claim came back empty waits before answering the next
#: hint. A work notification wakes every pool of every process at once; only one claim wins
#: it. Pools that keep losing step back by this much, so the one that last won claims
#: without competing for the CPU with the others' empty claims (on a two-core machine with
#: four worker processes, that competition was ~1.5 ms of every pickup). A pool that wins
#: a claim answers at once again, so a busy pool's work still goes to whoever is free, at
#: most this much later.
WAKE_STAGGER = 0.002


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
        #: The pause before answering a work notification: :data:`WAKE_STAGGER` after a
        #: hinted claim found nothing (another pool won it), 0 after one found work.
        self.wake_stagger = 0.0
        #: A slot's follow-on claim found the queue empty since the last claim of the loop:
        #: the slot it freed need not scan the queue again (see _claim_loop).
        self._queue_seen_empty = False
        #: The follow-on claim each running slot will ask its settle for. Live only while
        #: every slot is busy (see _refresh_follows); withdrawn at stop.
        self._follows: dict[asyncio.Task[None], FollowOnClaim] = {}
        self._tasks: dict[asyncio.Task[None], TurnRecord] = {}
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        #: A slot freed since the claim loop last counted free slots (a flag: waits go
        #: through _wake).
        self._slot_freed = False
        #: What the claim loop's current wait returns on (see _wait_for and _poke).
        self._wake: asyncio.Future[None] | None = None
        self._wake_on_slot = False
        self._done: asyncio.Event | None = None
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
        self._poke()
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
        forward = asyncio.create_task(self._forward_stop(stop)) if stop is not None else None
        logger.info(
            "worker %s serving %s (concurrency %d)",
            self.owner,
            sorted(self.agents),
            self.concurrency,
        )
        try:
            if self.scheduler is not None:
                self.scheduler.start()
            await self._claim_loop()
        finally:
            self._stop.set()
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
        self._stop.set()
        self._poke()

    # -- claiming ----------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        failures = 0
        hinted = False  # this claim answers a work notification
        slot_freed = False  # this claim follows a wait for a free slot
        while not self._stop.is_set():
            # Cleared before counting free slots, so a turn finishing after the count is
            # not missed: its done-callback sets the event and the wait below returns.
            self._slot_freed = False
            free = self.concurrency - len(self._tasks)
            if free <= 0:
                # No claim while full: a claimed turn we cannot start at once would sit
                # leased and idle while another worker could be running it.
                await self._wait_for(slot=True)
                hinted, slot_freed = False, True
                continue
            # After a work notification, claim the turns it named by their primary key: a
            # scan of the claim index steps over every dead entry left since the last
            # vacuum, and on a busy table that scan was most of the pickup latency. Any
            # other time (poll, start, a slot freed, missed notifications) scan the queue;
            # the hints it covers are dropped first.
            if slot_freed and self._queue_seen_empty:
                # The slot freed by a settle that already claimed for it and found nothing:
                # a scan now would find nothing either. Work queued since then was
                # announced, and the wait returns at once for it.
                self._queue_seen_empty = slot_freed = False
                hinted = await self._wait_for(slot=False, work=True)
                continue
            self._queue_seen_empty = slot_freed = False
            hints = self.store.take_work_hints()
            among = hints if hinted else None
            if among == []:  # woken by a notification already served by the last claim
                hinted = await self._wait_for(slot=False, work=True)
                continue
            try:
                claimed = await self.store.claim_next(
                    owner=self.owner,
                    lease_seconds=self.lease_seconds,
                    limit=free,
                    agents=sorted(self.agents),
                    among=among,
                )
            except Exception:
                failures += 1
                hinted = False  # the hints taken are lost with this claim: scan next time
                delay = min(MAX_CLAIM_BACKOFF, 0.1 * 2**failures)
                logger.warning(
                    "claim failed (%d in a row); retrying in %.1fs", failures, delay, exc_info=True
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                continue
            failures = 0
            for turn in claimed:
                self._start(turn)
            if hinted:
                self.wake_stagger = 0.0 if claimed else WAKE_STAGGER
            if len(claimed) == free:
                hinted = False
                continue  # every slot taken: maybe more is queued; the loop re-checks
            # Fewer than asked: the queue is empty for us, so sleep until a hint. A slot
            # freeing meanwhile does not wake us: it adds no work (a claim then would find
            # nothing — a wasted transaction after every turn), and anything queued since
            # the claim sent a work notification, or is found by the poll (retries whose
            # run_after is later, expired leases). Only a full pool waits for a slot.
            hinted = await self._wait_for(slot=False, work=True)
            if hinted and self.wake_stagger:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.wake_stagger)

    async def _wait_for(self, *, slot: bool, work: bool = False) -> bool:
        """Return on stop, a freed slot (if ``slot``), or a work hint / poll timeout; whether
        it was a work hint (woken before the poll interval ran out).

        Stop and a freed slot resolve one future (:meth:`_poke`); only the store's wait for
        work runs as a task. The claim loop waits here once or twice per turn; with a task
        each for the stop, the slot and the work, the waits cost 8% of a workflow's CPU
        (a client and a one-slot pool measured in one process).
        """
        if self._stop.is_set() or (slot and self._slot_freed):
            return False
        loop = asyncio.get_running_loop()
        started = loop.time()
        wake: asyncio.Future[None] = loop.create_future()
        self._wake, self._wake_on_slot = wake, slot
        work_waiter = None
        try:
            if not work:
                await wake
                return False
            # wait_for_work is only a hint (NOTIFY may be missed); its timeout is the poll.
            work_waiter = asyncio.create_task(self.store.wait_for_work(self.poll_interval))
            done, _ = await asyncio.wait([work_waiter, wake], return_when=asyncio.FIRST_COMPLETED)
            finished = work_waiter in done and not work_waiter.cancelled()
            if finished and work_waiter.exception() is not None:
                logger.warning("waiting for work failed", exc_info=work_waiter.exception())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.poll_interval)
                return False
            return work_waiter in done and loop.time() - started < self.poll_interval * 0.9
        finally:
            self._wake = None
            wake.cancel()
            if work_waiter is not None:
                work_waiter.cancel()
                await asyncio.gather(work_waiter, return_exceptions=True)

    def _poke(self, *, slot: bool = False) -> None:
        """Wake the claim loop's :meth:`_wait_for`: a stop, or (``slot``) a freed slot, which
        only a wait for a slot is woken by."""
        wake = self._wake
        if wake is not None and not wake.done() and (not slot or self._wake_on_slot):
            wake.set_result(None)

    def _start(self, turn: TurnRecord) -> None:
        self._note_claimed(turn)
        task = asyncio.create_task(self._run_slot(turn), name=f"turn {turn.id}")
        self._tasks[task] = turn
        self._refresh_follows()
        task.add_done_callback(self._finished)

    def _note_claimed(self, turn: TurnRecord) -> None:
        self.claimed_total += 1
        logger.info(
            "turn %s attempt %d claimed (agent %s)",
            turn.id,
            turn.attempts,
            turn.agent,
            extra={"turn_id": turn.id, "attempt": turn.attempts},
        )

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self._refresh_follows()
        self._slot_freed = True
        self._poke(slot=True)

    def _refresh_follows(self) -> None:
        """Let settles claim for their slot only while every slot is busy: exactly when a
        freed slot would otherwise scan the queue. With a slot free the pool is waiting for
        work notifications, and a scan per settle would mostly find turns another pool is
        already claiming by id."""
        live = 1 if len(self._tasks) >= self.concurrency and not self._stop.is_set() else 0
        for follow in self._follows.values():
            follow.limit = live

    # -- running one turn --------------------------------------------------------------

    async def _run_slot(self, turn: TurnRecord) -> None:
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
                    owner=self.owner, lease_seconds=self.lease_seconds, agents=sorted(self.agents)
                )
                self._follows[task] = follow
                self._refresh_follows()
            try:
                await self._execute(turn, follow)
            except asyncio.CancelledError:
                for claimed in follow.claimed if follow else []:
                    await self._hand_back(claimed, note="worker shutdown")
                raise
            finally:
                self._follows.pop(task, None)
            if follow is None or not follow.claimed:
                self._queue_seen_empty = self._queue_seen_empty or (
                    follow is not None and follow.ran
                )
                return
            turn, *extra = follow.claimed
            for claimed in extra:  # limit 1: a store that leased more still runs them
                self._start(claimed)
            self._tasks[task] = turn
            self._note_claimed(turn)

    async def _execute(self, turn: TurnRecord, follow: FollowOnClaim | None = None) -> None:
        """Run one claimed turn; logs every failure (a turn never takes the pool down)."""
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

        try:
            settled = await execute_claimed(
                agent.runner_config(),
                self.store,
                turn,
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
            return
        finally:
            if self.engine.local_aborts.get(turn.id) is signal:
                del self.engine.local_aborts[turn.id]
        if settled.status in SETTLED_STATUSES:
            self.settled_total += 1
        logger.info(
            "turn %s attempt %d %s%s",
            turn.id,
            turn.attempts,
            settled.status.value,
            f" ({settled.finish_reason.value})" if settled.finish_reason else "",
            extra={"turn_id": turn.id, "attempt": turn.attempts},
        )

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
        await asyncio.gather(*pending, return_exceptions=True)
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
