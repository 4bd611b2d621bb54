"""Agents: configuration, snapshots, abort, and how one turn is started and answered.

A turn always runs against a :class:`~engine.store.SessionStore`: the agent's own store, or —
for client-managed state (``store=None``) — a scratch in-memory store rebuilt from the
verified state blob, so every mode shares one runner and one set of rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.errors import (
    AgentError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    SessionBusyError,
    SnapshotNotResumableError,
    StoreError,
    TurnFailedError,
)
from engine.executor import LeaseSettings, RetryPolicy, run_inline
from engine.memory_store import InMemorySessionStore
from engine.model import Model
from engine.response import AgentChunk, AgentResponse, interrupts_of
from engine.resume import plan_continuation
from engine.runner import ChunkCallback, RunnerConfig
from engine.schemas import Schema
from engine.signals import AbortSignal
from engine.signing import StateSigner, canonical_json
from engine.snapshots import SessionSnapshot, SessionState, restore_client_state
from engine.status import ACTIVE_STATUSES, FinishReason, TurnStatus
from engine.store import (
    NewTurn,
    SessionStore,
    StoredSnapshot,
    TurnInput,
    TurnRecord,
)
from engine.tools import Tool

if TYPE_CHECKING:
    from engine.chat import Chat

__all__ = ["Agent", "SessionSnapshot", "SessionState", "TurnRequest"]

logger = logging.getLogger("turnstile.agent")

#: How many settled snapshots an agent keeps after waiting for them, so that continuing one
#: (typically: a resume right after the turn paused) does not read it again. See
#: :meth:`Agent._start`.
RECENT_SNAPSHOTS = 128


@dataclass(frozen=True)
class TurnRequest:
    """Where a turn continues from, and with what."""

    input: TurnInput
    session_id: str | None = None
    snapshot_id: str | None = None
    state: Mapping[str, Any] | None = None
    #: Who answers the interrupts of a resume (recorded on the journal rows).
    decided_by: str | None = None
    #: The principal the session belongs to (``None``: trusted local caller, no check). A
    #: new session is created for it; another principal's session is reported unknown.
    owner: str | None = None
    #: The new turn's id, chosen by the caller (e.g. to subscribe to its chunks first).
    turn_id: str | None = None
    #: The caller's key for this request: the same key again (a retry after a timeout or a
    #: lost answer) returns the turn the first request created instead of creating another.
    idempotency_key: str | None = None


@dataclass
class _Started:
    store: SessionStore
    turn: TurnRecord
    #: Created by an earlier request with the same idempotency key, not by this one.
    repeated: bool = False


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
        execution: str = "auto",
        poll_interval: float = 1.0,
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
        self.retry = retry or RetryPolicy()
        self.lease = lease or LeaseSettings()
        #: ``auto``: queue turns for the worker pool when the store is durable, else run
        #: them in the caller; ``inline`` / ``workers`` force one or the other.
        self.execution = execution
        self.poll_interval = poll_interval
        self._owner = owner
        self._local_aborts = local_aborts if local_aborts is not None else {}
        self._input_schemas: dict[str, Schema] = {t.name: t.input for t in tools}
        #: Snapshots of this agent's store seen settled by wait_settled, newest last.
        self._recent: OrderedDict[str, StoredSnapshot] = OrderedDict()

    @property
    def state_management(self) -> str:
        """``server`` with a store, ``client`` without (Genkit's action metadata)."""
        return "server" if self.store is not None else "client"

    def runner_config(self) -> RunnerConfig:
        """What the turn runner needs (also used by the worker pool)."""
        return RunnerConfig(
            agent=self.name,
            model=self.model,
            system=self.system,
            tools=self.tools,
            max_turns=self.max_turns,
        )

    def chat(
        self,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> Chat:
        """A conversation handle: new, or reopened by session id, snapshot id or state blob."""
        from engine.chat import Chat

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

    async def _own_turn(
        self, store: SessionStore, snapshot_id: str, owner: str | None = None
    ) -> TurnRecord:
        return await self._check_own(store, snapshot_id, await store.get_turn(snapshot_id), owner)

    async def _check_own(
        self, store: SessionStore, snapshot_id: str, turn: TurnRecord | None, owner: str | None
    ) -> TurnRecord:
        """``turn`` if it is this agent's and ``owner`` may see it; else "not found"."""
        if (
            turn is None
            or turn.agent != self.name
            or not await self._owned_by(store, turn.session_id, owner)
        ):
            raise NotFoundError(f"Snapshot '{snapshot_id}' not found for agent '{self.name}'.")
        return turn

    @staticmethod
    async def _owned_by(store: SessionStore, session_id: str, owner: str | None) -> bool:
        """Whether ``owner`` may see the session (``None``: a trusted local caller)."""
        if owner is None:
            return True
        session = await store.get_session(session_id)
        return session is not None and session.owner == owner

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
        if (
            turn is None
            or turn.agent != self.name
            or not await self._owned_by(store, turn.session_id, owner)
        ):
            return None
        return SessionSnapshot.of(turn, await store.load_conversation(turn.id))

    async def abort(self, snapshot_id: str, *, owner: str | None = None) -> TurnStatus:
        """Stop a running turn; returns the resulting status.

        ``pending`` → ``aborting`` while a runner holds it (it settles ``aborted`` at its next
        await, keeping its committed rounds) or straight to ``aborted`` when nobody does;
        settled snapshots are left as they are.
        """
        store = self._require_store("abort")
        await self._own_turn(store, snapshot_id, owner)
        return await self.abort_in(store, snapshot_id)

    async def abort_in(self, store: SessionStore, turn_id: str) -> TurnStatus:
        """Request the abort in ``store`` and wake the local runner, if it runs here."""
        status = await store.request_abort(turn_id)
        signal = self._local_aborts.get(turn_id)
        if status is TurnStatus.ABORTING and signal is not None:
            signal.set()
        return status

    # -- running a turn -----------------------------------------------------------------

    async def run_turn(
        self,
        request: TurnRequest,
        *,
        on_chunk: ChunkCallback | None = None,
        on_started: Any = None,
        wait: bool = True,
    ) -> AgentResponse:
        """Validate ``request``, create its pending turn, run it (here, or by the worker
        pool for a durable store) and answer.

        ``on_started(store, turn)`` is called once the turn exists (the chat uses it to
        track the running turn for ``abort``). With ``wait=False`` a queued turn is not
        awaited: the response is ``pending`` and carries its snapshot id. Raises a typed
        error, writing nothing, when the request is invalid; raises
        :class:`TurnFailedError` when the turn fails.
        """
        if self.queued and on_chunk is not None and wait:
            return await self._run_relayed(request, on_chunk, on_started)
        listening: list[asyncio.Future[None]] = []
        try:
            started = await self._start(request, listen=listening if self.queued and wait else None)
            if on_started is not None:
                on_started(started.store, started.turn)
            if self.queued or started.repeated:
                # A repeated request for a settled turn answers with it, as the first did.
                if not wait and started.turn.status in ACTIVE_STATUSES:
                    return AgentResponse(
                        session_id=started.turn.session_id,
                        snapshot_id=started.turn.id,
                        status=started.turn.status,
                        finish_reason=None,
                        messages=[],
                    )
                settled = await self.wait_settled(
                    started.store, started.turn.id, listening=listening[0] if listening else None
                )
                return await self.respond_for(started.store, settled)
        finally:
            for waiter in listening:
                waiter.cancel()
        signal = AbortSignal()
        self._local_aborts[started.turn.id] = signal
        try:
            # Shielded: a caller that stops waiting does not stop the turn (it settles and
            # persists, as a durable turn must); abort is the way to stop it.
            finished = await asyncio.shield(
                run_inline(
                    self.runner_config(),
                    started.store,
                    started.turn.id,
                    owner=self._owner,
                    on_chunk=on_chunk,
                    abort_signal=signal,
                    lease=self.lease,
                    retry=self.retry,
                )
            )
        finally:
            self._local_aborts.pop(started.turn.id, None)
        return await self.respond_for(started.store, finished)

    async def _run_relayed(
        self, request: TurnRequest, on_chunk: ChunkCallback, on_started: Any
    ) -> AgentResponse:
        """A queued turn whose caller streams: subscribe to its chunks *before* it exists
        (so the worker cannot publish one we miss), then forward them until it settles."""
        store = self._require_store("streaming a queued turn")
        turn_id = request.turn_id or (
            self._keyed_id(request) if request.idempotency_key is not None else str(uuid.uuid4())
        )
        request = replace(
            request, turn_id=turn_id, input=request.input.model_copy(update={"relay": True})
        )
        async with store.subscribe_chunks(turn_id) as chunks:
            started = await self._start(request)
            if on_started is not None:
                on_started(started.store, started.turn)

            async def forward() -> None:
                while True:
                    await on_chunk(AgentChunk.from_wire(await chunks.get()))

            forwarder = asyncio.create_task(forward())
            try:
                settled = await self.wait_settled(store, turn_id)
            finally:
                forwarder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await forwarder
            # Chunks are published before the turn settles; the ones already delivered but
            # not yet forwarded go out now, before the response.
            for chunk in chunks.drain():
                await on_chunk(AgentChunk.from_wire(chunk))
        return await self.respond_for(store, settled)

    @property
    def queued(self) -> bool:
        """Whether this agent's turns run in the worker pool rather than in the caller."""
        if self.execution == "auto":
            return self.store is not None and self.store.durable
        return self.execution == "workers"

    async def wait_settled(
        self,
        store: SessionStore,
        turn_id: str,
        timeout: float | None = None,
        *,
        listening: asyncio.Future[None] | None = None,
    ) -> StoredSnapshot:
        """Wait until a turn settles (any process may be running it) and return it, with
        its conversation and journal (read together, in one round trip where the store can).

        Woken by the store's change notifications, re-checking every ``poll_interval``
        seconds in case one was missed. Raises :class:`TimeoutError` after ``timeout``.
        ``listening``: a wait for the turn's change notification registered before the turn
        was created (nothing can have been missed): awaited first, without a read.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if listening is not None:
            with contextlib.suppress(TimeoutError):  # past the deadline: raised below
                await asyncio.wait_for(listening, timeout)
        # The first check usually follows the settle's notification: read the turn whole.
        # A turn still running then is polled by its row alone (a long turn must not cost
        # its whole conversation every poll) and read whole once settled.
        whole = True
        while True:
            wait_for = self.poll_interval
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"Snapshot {turn_id} did not settle in {timeout}s.")
                wait_for = min(wait_for, remaining)
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
                    turn_and_reads = stored or await store.read_snapshot(turn_id)
                    if turn_and_reads is not None:
                        self._remember(store, turn_and_reads)
                        return turn_and_reads
                    turn = None  # gone since (pruned)
                if turn is None:
                    raise NotFoundError(f"Snapshot '{turn_id}' not found for agent '{self.name}'.")
                whole = False
                await waiter
            finally:
                waiter.cancel()

    async def wait(
        self, snapshot_id: str, *, timeout: float | None = None, owner: str | None = None
    ) -> AgentResponse:
        """Wait for a pending snapshot (e.g. from ``send(..., wait=False)``) to settle and
        return its response; usable from any process that shares the store."""
        store = self._require_store("wait")
        await self._own_turn(store, snapshot_id, owner)
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
        state = None
        snapshot_id: str | None = turn.id
        if self.store is None:
            state = self.signer.sign(
                SessionState(session_id=turn.session_id, messages=messages).to_wire(),
                agent=self.name,
            )
            snapshot_id = None
        response = AgentResponse(
            session_id=turn.session_id,
            snapshot_id=snapshot_id,
            status=turn.status,
            finish_reason=turn.finish_reason,
            messages=messages,
            interrupts=(
                interrupts_of(messages[-1] if messages else None, self._input_schemas)
                if turn.finish_reason is FinishReason.INTERRUPTED
                else []
            ),
            state=state,
        )
        if turn.status is TurnStatus.FAILED:
            error = turn.error
            failure = TurnFailedError(
                error.message if error else "The turn failed.",
                status=error.status if error else "INTERNAL",
                details=error.details if error else None,
                snapshot_id=turn.id,
                response=response,
            )
            response.error = failure
            raise failure
        return response

    def _remember(self, store: SessionStore, stored: StoredSnapshot) -> None:
        """Keep a snapshot of this agent's own store that was just seen settled."""
        if store is not self.store:
            return  # a client-managed turn's scratch store: nothing to continue from
        self._recent[stored.turn.id] = stored
        self._recent.move_to_end(stored.turn.id)
        while len(self._recent) > RECENT_SNAPSHOTS:
            self._recent.popitem(last=False)

    def _keyed_id(self, request: TurnRequest) -> str:
        """The turn id of a request under an idempotency key: one per agent and principal."""
        assert request.idempotency_key is not None
        scope = f"{self.name}\x00{request.owner or ''}\x00{request.idempotency_key}"
        return "key-" + hashlib.sha256(scope.encode()).hexdigest()[:32]

    async def _repeated(self, store: SessionStore, request: TurnRequest) -> TurnRecord | None:
        """The turn an earlier request with ``request``'s idempotency key created (``None``:
        none yet); a different request under the same key is refused."""
        assert request.turn_id is not None
        earlier = await store.get_turn(request.turn_id)
        if earlier is None:
            return None
        same = (
            earlier.agent == self.name
            and request.session_id in (None, earlier.session_id)
            and request.snapshot_id in (None, earlier.parent_id)
            and _same_input(earlier.input, request.input)
            and await self._owned_by(store, earlier.session_id, request.owner)
        )
        if not same:
            raise InvalidArgumentError(
                f"Idempotency key {request.idempotency_key!r} was already used for a different "
                "request; use a new key for a new request."
            )
        logger.info("turn %s: repeated request (same idempotency key)", earlier.id)
        return earlier

    async def _created_already(
        self, store: SessionStore, new: NewTurn, refused: AgentError
    ) -> TurnRecord:
        """``new`` as the store holds it, if the refused creation had in fact happened (the
        same turn: id, session, parent and input); else ``refused`` is raised."""
        try:
            existing = await store.get_turn(new.id)
        except StoreError:
            raise refused from None
        if (
            existing is None
            or existing.session_id != new.session_id
            or existing.parent_id != new.parent_id
            or not _same_input(existing.input, new.input)
        ):
            if isinstance(refused, StoreError) and refused.may_have_applied:
                # Read back: the turn does not exist, so the write did not apply.
                raise StoreError(refused.message, may_have_applied=False) from refused
            raise refused
        logger.info("turn %s: created by an earlier attempt of this request", new.id)
        return existing

    async def _base(
        self, request: TurnRequest, recalled: StoredSnapshot | None = None
    ) -> tuple[SessionStore, TurnRecord | None, str, StoredSnapshot | None]:
        """The store, the snapshot the turn continues from (if any), the session id, and —
        when the snapshot was named by id — its conversation and journal, read with it
        (or ``recalled``: the same snapshot as :meth:`wait_settled` last returned it)."""
        if self.store is None:
            scratch = InMemorySessionStore()
            if request.state is None:
                return scratch, None, str(uuid.uuid4()), None
            verified = self.signer.verify(request.state, agent=self.name)
            signature = str(request.state.get("signature"))
            restored = await restore_client_state(
                scratch,
                verified,
                signature,
                agent=self.name,
                owner=self._owner,
                session_owner=request.owner,
            )
            return scratch, restored, str(verified["sessionId"]), None
        if request.snapshot_id is not None:
            # One read for the snapshot and what continuing it needs (one round trip on
            # PostgreSQL): a resume reads nothing else before it is queued.
            stored = recalled or await self.store.read_snapshot(request.snapshot_id)
            base = await self._check_own(
                self.store, request.snapshot_id, stored.turn if stored else None, request.owner
            )
            if request.session_id is not None and request.session_id != base.session_id:
                raise InvalidArgumentError(
                    f"Snapshot {base.id} does not belong to session {request.session_id} "
                    f"(it belongs to {base.session_id})."
                )
            return self.store, base, base.session_id, stored
        if request.session_id is not None:
            latest = await self.store.latest_turn(request.session_id)
            if latest is not None and (
                latest.agent != self.name
                or not await self._owned_by(self.store, latest.session_id, request.owner)
            ):
                raise NotFoundError(
                    f"Session '{request.session_id}' not found for agent '{self.name}'."
                )
            return self.store, latest, request.session_id, None
        return self.store, None, str(uuid.uuid4()), None

    async def _start(
        self, request: TurnRequest, *, listen: list[asyncio.Future[None]] | None = None
    ) -> _Started:
        """Validate ``request`` and create its pending turn.

        A snapshot named by id that this agent just saw settle (in :meth:`wait_settled`) is
        taken as it was then instead of being read again: a settled turn's conversation never
        changes, and what can change — its journal rows, answered by another resume — is
        re-checked by the store when it creates the turn, atomically. If anything is refused
        on that recalled copy, the request is checked once more on a fresh read, so the
        caller gets exactly the error (or success) it would have got without the recall.
        """
        if request.idempotency_key is not None and self.store is not None:
            request = replace(request, turn_id=request.turn_id or self._keyed_id(request))
            earlier = await self._repeated(self.store, request)
            if earlier is not None:
                return _Started(store=self.store, turn=earlier, repeated=True)
        recalled = (
            self._recent.pop(request.snapshot_id, None)
            if request.snapshot_id is not None and request.state is None
            else None
        )
        if recalled is None:
            return await self._start_from(request, listen=listen)
        # Fixed now, so a second attempt cannot create a second turn if the first one did.
        request = replace(request, turn_id=request.turn_id or str(uuid.uuid4()))
        try:
            return await self._start_from(request, listen=listen, recalled=recalled)
        except AgentError:
            logger.debug("turn %s: refused on the recalled snapshot; reading it", request.turn_id)
            return await self._start_from(request, listen=listen)

    async def _start_from(
        self,
        request: TurnRequest,
        *,
        listen: list[asyncio.Future[None]] | None = None,
        recalled: StoredSnapshot | None = None,
    ) -> _Started:
        store, base, session_id, stored = await self._base(request, recalled)
        turn_input = request.input
        if base is not None and base.status in ACTIVE_STATUSES and request.snapshot_id is None:
            # Named by session: its latest turn is still running, a conflict to retry.
            raise SessionBusyError(
                f"Session {session_id} already has a running turn ({base.id}, "
                f"{base.status.value}); wait for it to settle or abort it.",
                snapshot_id=base.id,
            )
        if base is not None and base.status in ACTIVE_STATUSES:
            raise SnapshotNotResumableError(
                f"Snapshot {base.id} is still {base.status.value}: wait for it to settle or "
                "abort it before continuing the session.",
                snapshot_id=base.id,
            )
        if base is not None and stored is None:
            # A base found by session id or restored from client state: read what continuing
            # it needs. It was seen settled, so this sees everything its settle wrote.
            stored = await store.read_snapshot(base.id)
            if stored is None:
                raise NotFoundError(f"Snapshot {base.id} not found.")
        # Read with the snapshot at one moment: a snapshot seen settled comes with its last
        # round and journal rows (written by the settling transaction).
        answers, history_length = plan_continuation(
            turn_input,
            base_id=base.id if base is not None else None,
            conversation=stored.conversation if stored else [],
            journal=stored.journal if stored else [],
            tools=self.tools,
            decided_by=request.decided_by,
        )
        if self.store is None and base is not None:
            turn_id = _client_turn_id(base.id, turn_input)
        else:
            turn_id = request.turn_id or str(uuid.uuid4())
        new = NewTurn(
            id=turn_id,
            session_id=session_id,
            agent=self.name,
            parent_id=base.id if base else None,
            input=turn_input,
            history_length=history_length,
            initial_messages=[turn_input.message] if turn_input.message is not None else [],
            max_attempts=self.retry.max_attempts,
            owner=request.owner,
        )
        if listen is not None:
            # Wait for the turn's change notification from before it exists: nothing can be
            # missed, so wait_settled's first check needs no read.
            listen.append(asyncio.ensure_future(store.wait_for_change(new.id, self.poll_interval)))
        try:
            turn = await store.create_turn(new, answers=answers)
        except AgentError as refused:
            # The creation may be this request's own: committed by an attempt whose answer
            # was lost (the store retried it and found it done), or by the first request
            # under the same idempotency key. Then it is a success, not a conflict.
            turn = await self._created_already(store, new, refused)
        logger.info(
            "turn %s (%s) created in session %r for agent %s",
            turn.id,
            turn_input.kind,
            session_id,
            self.name,
        )
        return _Started(store=store, turn=turn)


def _client_turn_id(base_id: str, turn_input: TurnInput) -> str:
    """The id of a client-managed turn continuing the verified snapshot ``base_id``.

    Without server state a signed blob can be replayed, so the id — and with it every
    idempotency key the turn hands out — is derived from what was continued: a replayed
    resume gets the same keys and cannot repeat an effect through a tool that honours its
    key. A resume counts by which calls it answers and how (respond or restart), not by
    what the answers say: free text such as ``feedback`` must not mint fresh keys for the
    same approval (see docs/decisions.md).
    """
    if turn_input.kind == "resume":
        answered = sorted(
            [("respond", str(p.tool_response.ref)) for p in turn_input.respond if p.tool_response]
            + [("restart", str(p.tool_request.ref)) for p in turn_input.restart if p.tool_request]
        )
        what: Any = {"kind": "resume", "answered": answered}
    else:
        what = turn_input.model_dump(mode="json", exclude={"relay"})
    replay = base_id.encode() + canonical_json(what)
    return "client-" + hashlib.sha256(replay).hexdigest()[:24]


def _same_input(stored: TurnInput, requested: TurnInput) -> bool:
    """Whether two turn inputs ask for the same thing (streaming or not is no difference)."""
    return stored.model_dump(mode="json", exclude={"relay"}) == requested.model_dump(
        mode="json", exclude={"relay"}
    )
