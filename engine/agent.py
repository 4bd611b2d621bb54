"""Agents: the public façade over configuration, snapshot reads, abort, and running a turn.

What a turn goes through lives in modules of its own — starting it (:mod:`engine.turns.start`),
waiting for it to settle (:mod:`engine.turns.waiting`), who may see it
(:mod:`engine.turns.ownership`), idempotent requests (:mod:`engine.turns.idempotency`),
client-managed state (:mod:`engine.state.client_state`) — and :class:`Agent` ties them to one
agent's configuration.

A turn always runs against a :class:`~engine.store.SessionStore`: the agent's own store, or —
for client-managed state (``store=None``) — a scratch in-memory store rebuilt from the
verified state blob, so every mode shares one runner and one set of rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from engine.chat import Chat
from engine.conversation.schemas import Schema, SchemaSpec
from engine.conversation.session_state import RelayedPatches, SessionData
from engine.errors import (
    AgentError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    SessionMismatchError,
    TurnTimeoutError,
)
from engine.ids import new_id
from engine.model import Model
from engine.response import AgentChunk, AgentResponse, refused_response, settled_response
from engine.state.client_state import BlobPin, sign_state
from engine.state.signing import StateSigner
from engine.state.snapshots import SessionSnapshot, SessionState
from engine.state.versioning import (
    Migration,
    describe_definition,
    fingerprint_of,
    tools_version_of,
)
from engine.status import ACTIVE_STATUSES, TurnStatus
from engine.store import AbortOutcome, SessionStore, StoredSnapshot, TurnRecord
from engine.store.signals import AbortSignal
from engine.tools import Tool
from engine.turns.executor import LeaseSettings, RetryPolicy, run_inline
from engine.turns.handover import CallerRuns, LocalSlots, SlotReservation, reserve_local_slot
from engine.turns.idempotency import keyed_turn_id
from engine.turns.ownership import own_turn, visible
from engine.turns.request import TurnRequest
from engine.turns.runner import ChunkCallback, RunnerConfig
from engine.turns.start import StartedTurn, start_turn
from engine.turns.waiting import timed_out, wait_settled
from engine.webhooks import WebhookRoutes

__all__ = [
    "ABORT_WAIT",
    "DEFAULT_UNCLAIMED_WARNING",
    "Agent",
    "SessionSnapshot",
    "SessionState",
    "TurnRequest",
    "check_unclaimed_warning",
]

logger = logging.getLogger("turnstile.agent")

#: Seconds a queued turn may wait unclaimed before its waiting caller logs a warning.
DEFAULT_UNCLAIMED_WARNING = 30.0
#: Seconds :meth:`Agent.request_abort` waits for a running turn's runner to stop it.
ABORT_WAIT = 5.0


def check_unclaimed_warning(seconds: float | None) -> float:
    """``seconds`` (``None``: :data:`DEFAULT_UNCLAIMED_WARNING`); raises ``ValueError`` when
    it is not a finite number of seconds >= 0 (0 turns the warning off)."""
    if seconds is None:
        return DEFAULT_UNCLAIMED_WARNING
    if not seconds >= 0 or math.isinf(seconds):
        raise ValueError(
            f"unclaimed_warning must be a number of seconds (0 turns the warning off); "
            f"got {seconds!r}."
        )
    return float(seconds)


def _pending_response(turn: TurnRecord) -> AgentResponse:
    """The answer for a turn left running: its ``pending`` snapshot."""
    return AgentResponse(
        session_id=turn.session_id,
        snapshot_id=turn.id,
        status=turn.status,
        finish_reason=None,
        messages=[],
    )


class Agent:
    """An agent defined with :meth:`engine.Engine.define_agent`."""

    def __init__(
        self,
        *,
        name: str,
        model: Model,
        system: str | None,
        tools: Sequence[Tool],
        store: SessionStore | None,
        signer: StateSigner,
        max_turns: int = 5,
        retry: RetryPolicy | None = None,
        lease: LeaseSettings | None = None,
        owner: str = "inline",
        local_aborts: dict[str, AbortSignal] | None = None,
        local_pools: list[LocalSlots] | None = None,
        execution: str = "auto",
        poll_interval: float = 1.0,
        unclaimed_warning: float | None = None,
        state_schema: SchemaSpec = None,
        declared_version: str | None = None,
        lenient_pinning: bool = False,
        migrations: Sequence[Migration] = (),
        config: Mapping[str, Any] | None = None,
        webhooks: WebhookRoutes | None = None,
    ) -> None:
        if execution not in ("auto", "inline", "workers"):
            raise ValueError("execution must be 'auto', 'inline' or 'workers'.")
        if execution == "workers" and store is None:
            raise ValueError("execution='workers' needs a store the workers can read.")
        names = [t.name for t in tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"Agent '{name}' lists tools twice: {sorted(duplicates)}.")
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1.")
        self.name = name
        self.model = model
        self.system = system
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.store = store
        self.signer = signer
        self.max_turns = max_turns
        #: What the session's custom state must match (``None``: any JSON value).
        self.state_schema = state_schema
        #: The generation config every model call of the agent carries.
        self.config: dict[str, Any] = dict(config or {})
        #: The engine's webhooks: who hears of this agent's approvals (groups' and by URL).
        self.webhooks = webhooks if webhooks is not None else WebhookRoutes()
        self.retry = retry or RetryPolicy()
        #: Whether the agent was given no policy of its own: ``turnstile worker --max-attempts``
        #: and ``--retry-backoff`` replace only such an agent's.
        self.default_retry = retry is None
        self.lease = lease or LeaseSettings()
        #: ``auto``: queue turns for the worker pool when the store is durable, else run
        #: them in the caller; ``inline`` / ``workers`` force one or the other.
        self.execution = execution
        self.poll_interval = poll_interval
        #: Seconds after which a caller waiting for a queued turn that no worker claimed
        #: logs a warning (once per wait); 0 never. Default: the engine's
        #: (``Engine(unclaimed_warning=)``), else :data:`DEFAULT_UNCLAIMED_WARNING`.
        self.unclaimed_warning = check_unclaimed_warning(unclaimed_warning)
        #: Who leases the turns this agent runs in the caller (inline and client-managed).
        self.lease_owner = owner
        self._local_aborts = local_aborts if local_aborts is not None else {}
        #: The engine's worker pools in this process (see engine/turns/handover.py).
        self._local_pools = local_pools if local_pools is not None else []
        self._input_schemas: dict[str, Schema] = {t.name: t.input for t in tools}
        #: Inline runs whose caller stopped waiting (a timeout): kept until they settle.
        self._unwaited: set[asyncio.Task[TurnRecord]] = set()
        #: The engine's declared application version (``None``: the tools version stands in).
        self.declared_version = declared_version
        #: The engine's ``lenient_pinning`` (``turnstile worker/serve --dev`` turns it on):
        #: resume across prompt-only definition changes even under a declared version.
        self.lenient_pinning = lenient_pinning
        #: The engine's registered migrations (the engine's own list: later ones count too).
        self.migrations = migrations
        # Described and hashed once, on first use (JSON-schema generation is not free).
        self._definition: dict[str, Any] | None = None
        self._fingerprint: str | None = None

    @property
    def definition(self) -> dict[str, Any]:
        """The canonical description of this agent's definition (see
        :func:`engine.state.versioning.describe_definition`)."""
        if self._definition is None:
            self._definition = describe_definition(
                agent=self.name,
                model=self.model.name,
                system=self.system,
                tools=self.tools,
                max_turns=self.max_turns,
            )
        return self._definition

    @property
    def fingerprint(self) -> str:
        """The stable hash of :attr:`definition`."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_of(self.definition)
        return self._fingerprint

    @property
    def version(self) -> str:
        """The application version this agent's new turns are pinned to: the engine's
        declared version, else the fingerprint of the agent's tools and their schemas (see
        :func:`engine.state.versioning.tools_version_of`)."""
        return self.declared_version or tools_version_of(self.definition)

    @property
    def served_versions(self) -> frozenset[str]:
        """The versions whose turns a worker of this agent claims: :attr:`version`, and
        without a declared version also the definition's fingerprint, which stood in for
        the version before tools versions (turns pinned then keep it)."""
        if self.declared_version is not None:
            return frozenset({self.declared_version})
        return frozenset({self.version, self.fingerprint})

    @property
    def state_management(self) -> str:
        """``server`` with a store, ``client`` without (Genkit's action metadata)."""
        return "server" if self.store is not None else "client"

    @property
    def queued(self) -> bool:
        """Whether this agent's turns run in the worker pool rather than in the caller."""
        if self.execution == "auto":
            return self.store is not None and self.store.durable
        return self.execution == "workers"

    async def reserve_slot(
        self, store: SessionStore, app_version: str | None
    ) -> SlotReservation | None:
        """Who runs a new turn of this agent, leased at its creation: its caller, for an
        inline agent; a free slot of a worker pool in this process; ``None``: nobody yet,
        the turn goes through the queue."""
        if not self.queued:
            return CallerRuns(self.lease_owner, self.lease.lease_seconds)
        return await reserve_local_slot(
            self._local_pools, store=store, agent=self.name, app_version=app_version
        )

    def runner_config(self) -> RunnerConfig:
        """What the turn runner needs (also used by the worker pool)."""
        return RunnerConfig(
            agent=self.name,
            model=self.model,
            system=self.system,
            tools=self.tools,
            max_turns=self.max_turns,
            state_schema=self.state_schema,
            model_config=self.config,
        )

    def chat(
        self,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> Chat:
        """A conversation handle: new, or reopened by session id, snapshot id or state blob.

        What its first send continues (docs/decisions.md, "What a send continues"):
        ``session_id`` alone, the session's latest turn; ``snapshot_id`` alone, exactly that
        snapshot (appended to when nothing but failed or aborted turns followed it, else
        branched into a new session by a new message); both, the snapshot only while it is
        still the session's latest. Every later send of the chat continues from where the
        chat is, as with both.
        """
        if self.store is None and (session_id or snapshot_id):
            which = "snapshotId" if snapshot_id else "sessionId"
            raise FailedPreconditionError(
                f"Cannot use '{which}' with agent '{self.name}': this agent has no store "
                "configured (client-managed state). Send 'state' instead."
            )
        if self.store is not None and state is not None:
            raise FailedPreconditionError(
                f"Cannot send 'state' to agent '{self.name}': this agent uses a server-managed "
                "store. Send 'snapshotId' or 'sessionId' instead."
            )
        if state is not None:
            self.signer.verify(state, agent=self.name)  # fail fast on a bad blob
        return Chat(self, session_id=session_id, snapshot_id=snapshot_id, state=state)

    # -- snapshots and abort ------------------------------------------------------------

    def _require_store(self, what: str) -> SessionStore:
        if self.store is None:
            raise FailedPreconditionError(
                f"{what} needs a session store; agent '{self.name}' uses client-managed state."
            )
        return self.store

    async def get_snapshot(
        self,
        *,
        snapshot_id: str | None = None,
        session_id: str | None = None,
        owner: str | None = None,
    ) -> SessionSnapshot | None:
        """The snapshot with that id, or the session's latest one; ``None`` if unknown
        (or, with ``owner``, if the session belongs to another principal)."""
        store = self._require_store("get_snapshot")
        if (snapshot_id is None) == (session_id is None):
            raise InvalidArgumentError("Give exactly one of snapshot_id and session_id.")
        if snapshot_id is not None:
            turn = await store.get_turn(snapshot_id)
        else:
            assert session_id is not None
            turn = await store.latest_turn(session_id)
        if turn is None or not await visible(store, turn, agent=self.name, owner=owner):
            return None
        return SessionSnapshot.of(turn, await store.load_conversation(turn.id))

    async def abort(self, snapshot_id: str, *, owner: str | None = None) -> TurnStatus | None:
        """Stop a running turn; returns its status **before** the abort, as Genkit's abort
        does (``None`` for a snapshot that does not exist or is not ``owner``'s to see).

        See :meth:`request_abort` for what it changes; that method also answers the status
        the turn was left in.
        """
        try:
            outcome = await self.request_abort(snapshot_id, owner=owner)
        except NotFoundError:
            return None
        return outcome.previous

    async def request_abort(
        self, snapshot_id: str, *, owner: str | None = None, wait: float = ABORT_WAIT
    ) -> AbortOutcome:
        """Stop a running turn; returns its status before and after.

        A ``pending`` turn no runner holds is ``aborted`` at once. One a runner holds moves to
        ``aborting``, and the call then waits up to ``wait`` seconds for the runner to stop
        and settle it ``aborted`` (keeping its committed rounds), so that a snapshot read
        afterwards says so; past the wait it answers ``aborting`` and the runner settles it
        later. Settled snapshots are left as they are. Raises
        :class:`~engine.errors.NotFoundError` for an unknown snapshot.
        """
        store = self._require_store("abort")
        await own_turn(store, snapshot_id, agent=self.name, owner=owner)
        outcome = await self.abort_in(store, snapshot_id)
        if outcome.status is not TurnStatus.ABORTING or wait <= 0:
            return outcome
        try:
            settled = await self.wait_settled(store, snapshot_id, wait)
        except TurnTimeoutError:
            return outcome
        return AbortOutcome(previous=outcome.previous, status=settled.turn.status)

    async def abort_in(self, store: SessionStore, turn_id: str) -> AbortOutcome:
        """Request the abort in ``store`` and wake the local runner, if it runs here."""
        outcome = await store.request_abort(turn_id)
        signal = self._local_aborts.get(turn_id)
        if outcome.status is TurnStatus.ABORTING and signal is not None:
            signal.set()
        return outcome

    # -- running a turn -----------------------------------------------------------------

    async def run_turn(
        self,
        request: TurnRequest,
        *,
        on_chunk: ChunkCallback | None = None,
        on_started: Any = None,
        wait: bool = True,
        timeout: float | None = None,
        worker_wait: float | None = None,
    ) -> AgentResponse:
        """Validate ``request``, create its pending turn, run it (here, or by the worker
        pool for a durable store) and answer.

        ``on_started(store, turn)`` is called once the turn exists (the chat uses it to
        track the running turn for ``abort``). With ``wait=False`` (Genkit's detach) the turn
        is not awaited — queued for the workers, or running on in this process — and the
        response is ``pending`` with its snapshot id; a client-managed agent, whose state
        has nowhere to be kept meanwhile, refuses it (``FAILED_PRECONDITION``). ``timeout``
        (seconds) bounds the wait for the turn to settle: past it
        :class:`~engine.errors.TurnTimeoutError` is raised and the turn is left pending
        (queued, or running — inline turns go on in this process). Raises a typed error,
        writing nothing, when the request is invalid; raises :class:`TurnFailedError` when
        the turn fails. ``worker_wait`` (seconds) bounds the wait for a worker to claim a
        queued turn: past it :class:`~engine.errors.NoWorkerError` is raised and the turn
        stays queued.
        """
        if timeout is not None and timeout <= 0:
            raise InvalidArgumentError(f"timeout must be positive seconds (got {timeout!r}).")
        if not wait and self.store is None:
            raise FailedPreconditionError(
                f"Cannot detach a turn of agent '{self.name}': detached turns need a store "
                "(client-managed state has nowhere to keep a running turn)."
            )
        if self.queued and on_chunk is not None and wait:
            return await self._run_relayed(request, on_chunk, on_started, timeout, worker_wait)
        listening: list[asyncio.Future[None]] = []
        try:
            started = await self._start(request, listen=listening if self.queued and wait else None)
            if on_started is not None:
                on_started(started.store, started.turn)
            if self.queued or started.repeated:
                return await self._answer_queued(started, wait, listening, timeout, worker_wait)
        finally:
            for waiter in listening:
                waiter.cancel()
        if not wait:
            # Detached: the turn runs on in this process; the caller has its pending snapshot.
            self._keep_unwaited(self._launch_inline(started, None))
            return _pending_response(started.turn)
        return await self._run_inline(started, on_chunk, timeout)

    async def submit(self, request: TurnRequest) -> AgentResponse:
        """Hand a turn to whoever runs it: queued for the workers (answered ``pending`` at
        once), or run here by an inline agent (answered once it settled). What the inbox,
        expiry and the operator's retries do with the turns they create."""
        return await self.run_turn(request, wait=not self.queued)

    async def _start(
        self, request: TurnRequest, *, listen: list[asyncio.Future[None]] | None = None
    ) -> StartedTurn:
        """:func:`start_turn`, with a refusal carrying the failed output Genkit answers it
        with (its ``response``), unless it is API misuse, which Genkit throws."""
        try:
            return await start_turn(self, request, listen=listen)
        except SessionMismatchError:
            raise
        except AgentError as refused:
            refused_response(refused, session_id=request.session_id)
            raise

    async def _answer_queued(
        self,
        started: StartedTurn,
        wait: bool,
        listening: list[asyncio.Future[None]],
        timeout: float | None,
        worker_wait: float | None,
    ) -> AgentResponse:
        """The response for a turn somebody else runs: settled, or ``pending`` at once
        without ``wait``."""
        # A repeated request for a settled turn answers with it, as the first did.
        if not wait and started.turn.status in ACTIVE_STATUSES:
            return _pending_response(started.turn)
        settled = await self.wait_settled(
            started.store,
            started.turn.id,
            timeout,
            listening=listening[0] if listening else None,
            worker_wait=worker_wait,
        )
        return await self.respond_for(started.store, settled)

    def _launch_inline(
        self, started: StartedTurn, on_chunk: ChunkCallback | None
    ) -> asyncio.Task[TurnRecord]:
        """Start running a turn in this process, abortable here by its signal."""
        turn_id = started.turn.id
        signal = AbortSignal()
        self._local_aborts[turn_id] = signal
        running = asyncio.ensure_future(
            run_inline(
                self.runner_config(),
                started.store,
                turn_id,
                claimed=started.claimed,
                owner=self.lease_owner,
                on_chunk=on_chunk,
                abort_signal=signal,
                lease=self.lease,
                retry=self.retry,
            )
        )
        # Abortable until it settles, even once nobody waits for it any more.
        running.add_done_callback(lambda _: self._local_aborts.pop(turn_id, None))
        return running

    def _keep_unwaited(self, running: asyncio.Task[TurnRecord]) -> None:
        """Hold a running turn nobody waits for until it settles."""
        self._unwaited.add(running)
        running.add_done_callback(self._unwaited.discard)

    async def _run_inline(
        self, started: StartedTurn, on_chunk: ChunkCallback | None, timeout: float | None
    ) -> AgentResponse:
        """Run a turn in the caller and answer once it settled."""
        running = self._launch_inline(started, on_chunk)
        try:
            # Shielded: a caller that stops waiting does not stop the turn (it settles and
            # persists, as a durable turn must); abort is the way to stop it.
            finished = await asyncio.wait_for(asyncio.shield(running), timeout)
        except TimeoutError:
            self._keep_unwaited(running)
            current = await started.store.get_turn(started.turn.id)
            raise timed_out(started.turn.id, timeout, current) from None
        except asyncio.CancelledError:
            self._keep_unwaited(running)
            raise
        return await self.respond_for(started.store, finished)

    async def _run_relayed(
        self,
        request: TurnRequest,
        on_chunk: ChunkCallback,
        on_started: Any,
        timeout: float | None,
        worker_wait: float | None,
    ) -> AgentResponse:
        """A queued turn whose caller streams: subscribe to its chunks *before* it exists
        (so the worker cannot publish one we miss), then forward them until it settles."""
        store = self._require_store("streaming a queued turn")
        turn_id = request.turn_id or (
            keyed_turn_id(self.name, request) if request.idempotency_key is not None else new_id()
        )
        request = replace(
            request, turn_id=turn_id, input=request.input.model_copy(update={"relay": True})
        )
        async with store.subscribe_chunks(turn_id) as chunks:
            started = await self._start(request)
            if on_started is not None:
                on_started(started.store, started.turn)
            patches = RelayedPatches(started.turn.custom)

            async def forward() -> None:
                while True:
                    chunk = await chunks.get()
                    if patches.admit(chunk):
                        await on_chunk(AgentChunk.from_wire(chunk))

            forwarder = asyncio.create_task(forward())
            try:
                settled = await self.wait_settled(store, turn_id, timeout, worker_wait=worker_wait)
            finally:
                forwarder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await forwarder
            # Chunks are published before the turn settles; the ones already delivered but
            # not yet forwarded go out now, before the response.
            for chunk in chunks.drain():
                if patches.admit(chunk):
                    await on_chunk(AgentChunk.from_wire(chunk))
            # A lost patch must not leave the caller's custom state wrong (see RelayedPatches).
            rebase = patches.rebase(settled.turn.custom)
            if rebase is not None:
                await on_chunk(AgentChunk.from_wire(rebase))
        return await self.respond_for(store, settled)

    # -- answering ----------------------------------------------------------------------

    async def wait_settled(
        self,
        store: SessionStore,
        turn_id: str,
        timeout: float | None = None,
        *,
        listening: asyncio.Future[None] | None = None,
        worker_wait: float | None = None,
    ) -> StoredSnapshot:
        """Wait until a turn settles (any process may be running it) and return it, with
        its conversation and journal; see :func:`engine.turns.waiting.wait_settled`."""
        return await wait_settled(
            store,
            turn_id,
            agent=self.name,
            poll_interval=self.poll_interval,
            timeout=timeout,
            listening=listening,
            unclaimed_warning=self.unclaimed_warning,
            worker_wait=worker_wait,
        )

    async def wait(
        self, snapshot_id: str, *, timeout: float | None = None, owner: str | None = None
    ) -> AgentResponse:
        """Wait for a pending snapshot (e.g. from ``send(..., wait=False)``) to settle and
        return its response; usable from any process that shares the store. Past
        ``timeout`` seconds, :class:`~engine.errors.TurnTimeoutError`."""
        store = self._require_store("wait")
        await own_turn(store, snapshot_id, agent=self.name, owner=owner)
        settled = await self.wait_settled(store, snapshot_id, timeout)
        return await self.respond_for(store, settled)

    async def respond_for(
        self, store: SessionStore, settled: TurnRecord | StoredSnapshot
    ) -> AgentResponse:
        """The response for a settled turn (raises :class:`TurnFailedError` if it failed);
        its conversation is read unless ``settled`` came with it."""
        if isinstance(settled, StoredSnapshot):
            turn, messages = settled.turn, settled.conversation
        else:
            turn, messages = settled, await store.load_conversation(settled.id)
        if self.store is not None:
            response = settled_response(turn, messages, self._input_schemas)
            if isinstance(settled, StoredSnapshot):
                response.stored = settled
            return response
        # Client-managed: the client keeps the conversation, signed; there is no snapshot id.
        fingerprint = turn.definition_fingerprint
        definition = await store.read_definition(fingerprint) if fingerprint else None
        state = sign_state(
            self.signer,
            agent=self.name,
            session_id=turn.session_id,
            messages=messages,
            data=SessionData.of(turn.custom, turn.artifacts),
            pin=BlobPin.of(turn, definition),
        )
        return settled_response(turn, messages, self._input_schemas, state=state)
